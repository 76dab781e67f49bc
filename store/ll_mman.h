/* ll_mman: memory-mapping flags the store uses that older libc headers lack
 * (the kernels that run it have them; a call on one that does not fails
 * with EINVAL, which callers handle).  Included by store/ code only. */
#ifndef LL_MMAN_H
#define LL_MMAN_H

#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif

#endif
