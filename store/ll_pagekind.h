/* ll_pagekind: which pages a new payload pool gets (hugetlbfs file, hugetlb
 * memfd, shmem THP, 4 KiB pages), and why.
 *
 * Two halves, kept apart so the decision can be scripted: the host's facts
 * (huge-page counts, mounts, the shmem THP mode) are read from /proc and
 * /sys by ll_pagekind_host_read, and the choice is a pure function of those
 * facts, the pool's size, whether the caller is the session's owner and the
 * LL_STORE_PAGE_KIND knob (ll_pagekind_choose).  The self-test feeds the
 * choice hosts this one is not.  Used by ll_store when it makes a new pool
 * and by _llstore.page_kind_choice(); any thread. */
#ifndef LL_PAGEKIND_H
#define LL_PAGEKIND_H

#include <stdbool.h>
#include <stddef.h>

/* What the host offers a new pool. */
typedef struct {
    unsigned long long hp_kb;         /* Hugepagesize (kB) */
    unsigned long long hp_free;       /* HugePages_Free: persistent or surplus, unused */
    unsigned long long hp_rsvd;       /* HugePages_Rsvd: promised to mappings already */
    unsigned long long hp_surp;       /* HugePages_Surp: surplus pages in use now */
    unsigned long long hp_overcommit; /* vm.nr_overcommit_hugepages */
    unsigned long long avail_kb;      /* MemAvailable: what surplus pages come out of */
    char hugetlbfs_dir[1024];         /* a writable hugetlbfs mount, or "" */
    bool dev_shm_thp;                 /* /dev/shm's mount gives THP (huge=) */
    char shmem_enabled[32];           /* the selected shmem THP mode, e.g. "never" */
} ll_pagekind_host_t;

/* Where a new pool goes. */
typedef enum {
    LL_PAGEKIND_NONE = -1,         /* a bad knob, or hugetlb forced where it cannot be had */
    LL_PAGEKIND_SHM_FILE = 0,      /* a /dev/shm file: THP when its mount says so, else 4 KiB */
    LL_PAGEKIND_HUGETLBFS = 1,     /* a file on a hugetlbfs mount */
    LL_PAGEKIND_MEMFD_HUGETLB = 2, /* a nameless hugetlb pool of the session's owner */
    LL_PAGEKIND_MEMFD_THP = 3,     /* a nameless shmem-THP pool of the session's owner */
} ll_pagekind_place_t;

/* The outcome of ll_pagekind_choose. */
typedef struct {
    ll_pagekind_place_t place;
    const char *name; /* "hugetlb", "thp" or "4k" (a static string); NULL with NONE */
    bool forced;      /* LL_STORE_PAGE_KIND=hugetlb: huge pages or an error, no fallback */
    bool fallback;    /* not forced, and not a /dev/shm file (a hugetlbfs file or a
                         memfd): if the pool cannot be made so, a 4 KiB /dev/shm file
                         (LL_PAGEKIND_SHM_FILE) instead */
} ll_pagekind_choice_t;

/* Read the host's facts into *HOST.  ROOT NULL (or ""): this host; else a
 * directory that stands for "/" (the self-test's made-up /proc and /sys).
 * A file that cannot be read leaves its facts zero / empty. */
void ll_pagekind_host_read(const char *root, ll_pagekind_host_t *host);

/* Huge pages a new pool could get on HOST: the free ones not promised to a
 * mapping, plus the surplus the kernel may still allocate on demand. */
unsigned long long ll_pagekind_hp_available(const ll_pagekind_host_t *host);

/* Pure: where a new pool of POOL_BYTES goes on HOST, made by the session's
 * owner (OWNER: the store that started the private redis-server) or not,
 * under KNOB (LL_STORE_PAGE_KIND: NULL, "" or "auto", "hugetlb", "4k").
 * Fills *OUT and writes why into WHY (always).  0, or -1 (OUT->place NONE)
 * for a bad KNOB or a forced hugetlb this caller cannot make. */
int ll_pagekind_choose(const ll_pagekind_host_t *host, size_t pool_bytes, bool owner,
                       const char *knob, ll_pagekind_choice_t *out, char *why, size_t whylen);

/* The pool path for PLACE: "memfd:hugetlb", "memfd:thp", or a file
 * <dir>/looseleaf-<uid>-<hash(realpath(RUNTIME_DIR))>-<SESSION>.pool in
 * HOST's hugetlbfs mount or /dev/shm.  Returns a malloc'd string the caller
 * frees, or NULL (out of memory, or PLACE NONE). */
char *ll_pagekind_path(ll_pagekind_place_t place, const ll_pagekind_host_t *host,
                       const char *runtime_dir, const char *session);

int ll_pagekind_selftest(bool verbose);

#endif
