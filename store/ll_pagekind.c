/* ll_pagekind: the page kind of a new payload pool (see ll_pagekind.h).
 * Any thread; ll_pagekind_choose touches nothing but its arguments.
 *
 * MEASURED.md: first touch of 4 KiB shared-memory pages runs ~50x slower
 * than memcpy, huge pages ~1-2x.  So `auto` takes huge pages wherever the
 * host offers them for the whole pool, in this order: a hugetlbfs mount; a
 * hugetlb memfd; /dev/shm when its mount gives THP; a memfd with shmem THP;
 * else a plain /dev/shm file.  A memfd lives only as long as its creator, so
 * only the session's owner (the kernel) makes one; other processes open the
 * owner's through /proc/<pid>/fd/<n>.  Huge pages "available" counts the
 * surplus room (vm.nr_overcommit_hugepages) as far as free memory goes:
 * surplus pages come from the buddy allocator when a region is backed and go
 * back when the pool is gone, so an installer can allow them without locking
 * memory away (persistent vm.nr_hugepages would).  Counted pages may still
 * not come (fragmentation, another pool first): the store then falls back to
 * 4 KiB pages (ll_pagekind_choice_t.fallback). */
#include "store/ll_pagekind.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "store/ll_pool.h"

/* ---- the host's facts ------------------------------------------------- */

static FILE *s_open(const char *root, const char *path)
{
    char full[2048];
    snprintf(full, sizeof full, "%s%s", root, path);
    return fopen(full, "re");
}

void ll_pagekind_host_read(const char *root, ll_pagekind_host_t *h)
{
    if (!root)
        root = "";
    memset(h, 0, sizeof *h);
    char line[4096];
    FILE *f = s_open(root, "/proc/meminfo");
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "Hugepagesize: %llu kB", &h->hp_kb);
        sscanf(line, "HugePages_Free: %llu", &h->hp_free);
        sscanf(line, "HugePages_Rsvd: %llu", &h->hp_rsvd);
        sscanf(line, "HugePages_Surp: %llu", &h->hp_surp);
        sscanf(line, "MemAvailable: %llu kB", &h->avail_kb);
    }
    if (f)
        fclose(f);
    f = s_open(root, "/proc/sys/vm/nr_overcommit_hugepages");
    if (f) {
        if (fscanf(f, "%llu", &h->hp_overcommit) != 1)
            h->hp_overcommit = 0;
        fclose(f);
    }
    /* The first hugetlbfs mount this process may write to (checked under
     * ROOT; the path recorded is the mount's own). */
    f = s_open(root, "/proc/mounts");
    char dev[256], dir[1024], type[64], full[2048];
    while (f && fscanf(f, "%255s %1023s %63s %*[^\n]", dev, dir, type) == 3) {
        snprintf(full, sizeof full, "%s%s", root, dir);
        if (strcmp(type, "hugetlbfs") == 0 && access(full, W_OK) == 0) {
            snprintf(h->hugetlbfs_dir, sizeof h->hugetlbfs_dir, "%s", dir);
            break;
        }
    }
    if (f)
        fclose(f);
    f = s_open(root, "/proc/self/mountinfo");
    while (f && fgets(line, sizeof line, f)) {
        char mnt[1024];
        if (sscanf(line, "%*s %*s %*s %*s %1023s", mnt) == 1 && strcmp(mnt, "/dev/shm") == 0)
            h->dev_shm_thp =
                strstr(line, "huge=") && !strstr(line, "huge=never") && !strstr(line, "huge=deny");
    }
    if (f)
        fclose(f);
    f = s_open(root, "/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    if (f) {
        if (fgets(line, sizeof line, f)) {
            char *b = strchr(line, '['), *e = b ? strchr(b, ']') : NULL;
            if (b && e)
                snprintf(h->shmem_enabled, sizeof h->shmem_enabled, "%.*s", (int) (e - b - 1),
                         b + 1);
        }
        fclose(f);
    }
}

/* ---- the choice (pure) ------------------------------------------------ */

unsigned long long ll_pagekind_hp_available(const ll_pagekind_host_t *h)
{
    if (h->hp_kb == 0)
        return 0;
    unsigned long long free = h->hp_free > h->hp_rsvd ? h->hp_free - h->hp_rsvd : 0;
    unsigned long long room = h->hp_overcommit > h->hp_surp ? h->hp_overcommit - h->hp_surp : 0;
    unsigned long long mem = h->avail_kb / h->hp_kb;
    return free + (room < mem ? room : mem);
}

static int s_chose(ll_pagekind_choice_t *out, ll_pagekind_place_t place, const char *name,
                   bool forced)
{
    out->place = place;
    out->name = name;
    out->forced = forced;
    out->fallback = place != LL_PAGEKIND_NONE && place != LL_PAGEKIND_SHM_FILE && !forced;
    return place == LL_PAGEKIND_NONE ? -1 : 0;
}

int ll_pagekind_choose(const ll_pagekind_host_t *h, size_t pool_bytes, bool owner, const char *knob,
                       ll_pagekind_choice_t *out, char *why, size_t whylen)
{
    unsigned long long hp_bytes = h->hp_kb << 10, avail = ll_pagekind_hp_available(h);
    unsigned long long need = hp_bytes ? (pool_bytes + hp_bytes - 1) / hp_bytes : 0;
    char hp[320];
    snprintf(hp, sizeof hp,
             "%llu huge pages of %llu kB available (HugePages_Free %llu - HugePages_Rsvd %llu, "
             "+ surplus room: vm.nr_overcommit_hugepages %llu - HugePages_Surp %llu, at most "
             "MemAvailable), a pool of %zu MiB needs %llu",
             avail, h->hp_kb, h->hp_free, h->hp_rsvd, h->hp_overcommit, h->hp_surp,
             pool_bytes >> 20, need);
    bool thp_memfd =
        strcmp(h->shmem_enabled, "always") == 0 || strcmp(h->shmem_enabled, "within_size") == 0 ||
        strcmp(h->shmem_enabled, "advise") == 0 || strcmp(h->shmem_enabled, "force") == 0;
    bool forced = knob && strcmp(knob, "hugetlb") == 0;
    if (knob && strcmp(knob, "4k") == 0) {
        snprintf(why, whylen, "4k: LL_STORE_PAGE_KIND=4k");
        return s_chose(out, LL_PAGEKIND_SHM_FILE, "4k", false);
    }
    if (knob && *knob && !forced && strcmp(knob, "auto") != 0) {
        snprintf(why, whylen, "LL_STORE_PAGE_KIND must be auto, hugetlb or 4k, not '%.40s'", knob);
        return s_chose(out, LL_PAGEKIND_NONE, NULL, false);
    }
    bool hp_ok = hp_bytes == LL_POOL_REGION_BYTES && avail >= need;
    if ((hp_ok || forced) && h->hugetlbfs_dir[0]) {
        snprintf(why, whylen, "hugetlb (a file on the hugetlbfs mount %.200s): %s%s",
                 h->hugetlbfs_dir, forced ? "LL_STORE_PAGE_KIND=hugetlb; " : "", hp);
        return s_chose(out, LL_PAGEKIND_HUGETLBFS, "hugetlb", forced);
    }
    if ((hp_ok || forced) && owner) {
        snprintf(why, whylen, "hugetlb (memfd): %s%s", forced ? "LL_STORE_PAGE_KIND=hugetlb; " : "",
                 hp);
        return s_chose(out, LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", forced);
    }
    if (forced) {
        snprintf(why, whylen,
                 "LL_STORE_PAGE_KIND=hugetlb: no writable hugetlbfs mount, and only "
                 "the session's owner (the store that starts the private redis-server) makes a "
                 "hugetlb memfd");
        return s_chose(out, LL_PAGEKIND_NONE, NULL, true);
    }
    if (h->dev_shm_thp) {
        snprintf(why, whylen, "thp (/dev/shm is mounted with huge=): %s", hp);
        return s_chose(out, LL_PAGEKIND_SHM_FILE, "thp", false);
    }
    if (owner && thp_memfd) {
        snprintf(why, whylen, "thp (memfd, shmem_enabled=%s): %s", h->shmem_enabled, hp);
        return s_chose(out, LL_PAGEKIND_MEMFD_THP, "thp", false);
    }
    snprintf(why, whylen, "4k: %s%s; shmem THP %s (shmem_enabled=%s, /dev/shm without huge=)", hp,
             hp_bytes == LL_POOL_REGION_BYTES ? "" : " (not 2 MiB pages)",
             thp_memfd ? "only for the session's owner" : "off",
             h->shmem_enabled[0] ? h->shmem_enabled : "?");
    return s_chose(out, LL_PAGEKIND_SHM_FILE, "4k", false);
}

char *ll_pagekind_path(ll_pagekind_place_t place, const ll_pagekind_host_t *h,
                       const char *runtime_dir, const char *session)
{
    if (place == LL_PAGEKIND_NONE)
        return NULL;
    if (place == LL_PAGEKIND_MEMFD_HUGETLB)
        return strdup("memfd:hugetlb");
    if (place == LL_PAGEKIND_MEMFD_THP)
        return strdup("memfd:thp");
    char *real = realpath(runtime_dir, NULL);
    const char *rd = real ? real : runtime_dir;
    unsigned long long hsh = (unsigned long long) XXH3_64bits(rd, strlen(rd));
    free(real);
    const char *dir = place == LL_PAGEKIND_HUGETLBFS ? h->hugetlbfs_dir : "/dev/shm";
    size_t n = strlen(dir) + strlen(session) + 80;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/looseleaf-%u-%08llx-%s.pool", dir, (unsigned) geteuid(),
                 hsh & 0xffffffffULL, session);
    return p;
}

/* ---- self-test -------------------------------------------------------- */

/* The choice on made-up hosts (the real one may have no huge pages). */
static int s_choose_cases(bool verbose)
{
    const unsigned long long G = 1024ULL * 1024; /* kB */
    const size_t pool = (size_t) 11 << 30;       /* 5632 huge pages */
    char why[768];
    /* clang-format off */
    struct {
        ll_pagekind_host_t h;
        bool owner;
        const char *knob;
        ll_pagekind_place_t want;
        const char *name;
        bool fallback;
        const char *why_has;
    } cases[] = {
        /* A host without huge pages or THP. */
        {{.hp_kb = 2048, .avail_kb = 20 * G, .shmem_enabled = "never"},
         true, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "4k: 0 huge pages"},
        /* Surplus room counts, for the owner's memfd... */
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G, .shmem_enabled = "never"},
         true, NULL, LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", true, "6000 huge pages"},
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G},
         true, "auto", LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", true, "hugetlb (memfd)"},
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G},
         true, "", LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", true, "hugetlb (memfd)"},
        /* ...not for others without a hugetlbfs mount (a memfd dies with its maker). */
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G},
         false, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "4k"},
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G, .hugetlbfs_dir = "/mnt/h"},
         false, NULL, LL_PAGEKIND_HUGETLBFS, "hugetlb", true, "/mnt/h"},
        /* A hugetlbfs mount comes before the owner's memfd. */
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G, .hugetlbfs_dir = "/mnt/h"},
         true, NULL, LL_PAGEKIND_HUGETLBFS, "hugetlb", true, "hugetlbfs mount /mnt/h"},
        /* Surplus pages in use are not room; nor is memory that is not there. */
        {{.hp_kb = 2048, .hp_overcommit = 6000, .hp_surp = 1000, .avail_kb = 20 * G},
         true, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "5000 huge pages"},
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 8 * G},
         true, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "4096 huge pages"},
        /* Free persistent pages count, less those promised to mappings. */
        {{.hp_kb = 2048, .hp_free = 6000, .hp_rsvd = 1000, .avail_kb = G},
         true, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "5000 huge pages"},
        {{.hp_kb = 2048, .hp_free = 3000, .hp_overcommit = 3000, .avail_kb = 20 * G},
         true, NULL, LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", true, "6000 huge pages"},
        /* Exactly enough is enough. */
        {{.hp_kb = 2048, .hp_free = 5632, .avail_kb = G},
         true, NULL, LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", true, "needs 5632"},
        /* 1 GiB pages do not fit 2 MiB regions. */
        {{.hp_kb = G, .hp_free = 20, .avail_kb = 20 * G},
         true, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "not 2 MiB pages"},
        /* shmem THP for the owner's memfd (with the 4 KiB fallback of any
         * memfd), or /dev/shm mounted with huge=. */
        {{.hp_kb = 2048, .avail_kb = 20 * G, .shmem_enabled = "advise"},
         true, NULL, LL_PAGEKIND_MEMFD_THP, "thp", true, "thp (memfd"},
        {{.hp_kb = 2048, .avail_kb = 20 * G, .shmem_enabled = "within_size"},
         true, NULL, LL_PAGEKIND_MEMFD_THP, "thp", true, "shmem_enabled=within_size"},
        {{.hp_kb = 2048, .avail_kb = 20 * G, .shmem_enabled = "advise"},
         false, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "only for the session's owner"},
        {{.hp_kb = 2048, .avail_kb = 20 * G, .shmem_enabled = "deny"},
         true, NULL, LL_PAGEKIND_SHM_FILE, "4k", false, "shmem THP off"},
        {{.hp_kb = 2048, .avail_kb = 20 * G, .dev_shm_thp = true},
         false, NULL, LL_PAGEKIND_SHM_FILE, "thp", false, "thp (/dev/shm"},
        /* Huge pages before THP. */
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G, .dev_shm_thp = true},
         true, NULL, LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", true, "hugetlb (memfd)"},
        /* The knob: 4k wins over everything, hugetlb is never a fallback. */
        {{.hp_kb = 2048, .hp_overcommit = 6000, .avail_kb = 20 * G, .dev_shm_thp = true},
         true, "4k", LL_PAGEKIND_SHM_FILE, "4k", false, "LL_STORE_PAGE_KIND=4k"},
        {{.hp_kb = 2048, .avail_kb = 20 * G},
         true, "hugetlb", LL_PAGEKIND_MEMFD_HUGETLB, "hugetlb", false, "LL_STORE_PAGE_KIND=hugetlb"},
        {{.hp_kb = 2048, .avail_kb = 20 * G, .hugetlbfs_dir = "/mnt/h"},
         false, "hugetlb", LL_PAGEKIND_HUGETLBFS, "hugetlb", false, "LL_STORE_PAGE_KIND=hugetlb"},
        {{.hp_kb = 2048, .avail_kb = 20 * G},
         false, "hugetlb", LL_PAGEKIND_NONE, NULL, false, "only the session's owner"},
        {{.hp_kb = 2048, .avail_kb = 20 * G},
         true, "huge", LL_PAGEKIND_NONE, NULL, false, "must be auto, hugetlb or 4k"},
    };
    /* clang-format on */
    size_t ncases = sizeof cases / sizeof cases[0];
    for (size_t c = 0; c < ncases; c++) {
        ll_pagekind_choice_t got;
        int rc = ll_pagekind_choose(&cases[c].h, pool, cases[c].owner, cases[c].knob, &got, why,
                                    sizeof why);
        bool forced = cases[c].knob && strcmp(cases[c].knob, "hugetlb") == 0;
        bool name_ok = cases[c].name ? got.name && strcmp(got.name, cases[c].name) == 0 : !got.name;
        if (got.place != cases[c].want || rc != (cases[c].want == LL_PAGEKIND_NONE ? -1 : 0) ||
            !name_ok || got.fallback != cases[c].fallback || got.forced != forced ||
            !strstr(why, cases[c].why_has)) {
            fprintf(stderr,
                    "ll_pagekind selftest: case %zu: got %d %s fallback=%d (%s), want %d %s "
                    "fallback=%d (%s)\n",
                    c, got.place, got.name ? got.name : "-", got.fallback, why, cases[c].want,
                    cases[c].name ? cases[c].name : "-", cases[c].fallback, cases[c].why_has);
            return -1;
        }
    }
    if (verbose)
        printf("(%zu hosts) ", ncases);
    return 0;
}

static int s_write(const char *root, const char *path, const char *text)
{
    char full[2048];
    snprintf(full, sizeof full, "%s%s", root, path);
    for (char *s = full + strlen(root) + 1; *s; s++) /* mkdir -p of its directory */
        if (*s == '/') {
            *s = 0;
            if (mkdir(full, 0700) != 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    FILE *f = fopen(full, "we");
    if (!f)
        return -1;
    int rc = fputs(text, f) < 0 ? -1 : 0;
    return fclose(f) != 0 ? -1 : rc;
}

/* The facts read from made-up /proc and /sys files, then the paths. */
static int s_read_cases(void)
{
    char root[] = "/tmp/ll-pagekind-selftest-XXXXXX";
    if (!mkdtemp(root))
        return -1;
    int rc = -1;
    ll_pagekind_host_t h;
    char *p = NULL;
    if (s_write(root, "/proc/meminfo",
                "MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n"
                "HugePages_Total:       4\nHugePages_Free:        3\nHugePages_Rsvd:        1\n"
                "HugePages_Surp:        2\nHugepagesize:       2048 kB\n") != 0 ||
        s_write(root, "/proc/sys/vm/nr_overcommit_hugepages", "700\n") != 0 ||
        s_write(root, "/proc/mounts",
                "tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n"
                "nodev /mnt/gone hugetlbfs rw,relatime,pagesize=2M 0 0\n"
                "nodev /mnt/huge hugetlbfs rw,relatime,pagesize=2M 0 0\n") != 0 ||
        s_write(root, "/mnt/huge/.keep", "") != 0 ||
        s_write(root, "/proc/self/mountinfo",
                "22 1 0:5 / /dev rw - devtmpfs udev rw\n"
                "30 22 0:26 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw,huge=within_size\n") != 0 ||
        s_write(root, "/sys/kernel/mm/transparent_hugepage/shmem_enabled",
                "always within_size [advise] never deny force\n") != 0)
        goto out;
    ll_pagekind_host_read(root, &h);
    if (h.hp_kb != 2048 || h.hp_free != 3 || h.hp_rsvd != 1 || h.hp_surp != 2 ||
        h.hp_overcommit != 700 || h.avail_kb != 20000000 || !h.dev_shm_thp ||
        strcmp(h.shmem_enabled, "advise") != 0 || strcmp(h.hugetlbfs_dir, "/mnt/huge") != 0 ||
        ll_pagekind_hp_available(&h) != 2 + 698) {
        fprintf(stderr, "ll_pagekind selftest: facts read wrong (hugetlbfs %s, shmem %s)\n",
                h.hugetlbfs_dir, h.shmem_enabled);
        goto out;
    }
    /* /dev/shm with huge=never, no files at all. */
    if (s_write(root, "/proc/self/mountinfo",
                "30 22 0:26 / /dev/shm rw - tmpfs tmpfs rw,huge=never\n") != 0)
        goto out;
    ll_pagekind_host_read(root, &h);
    if (h.dev_shm_thp)
        goto out;
    ll_pagekind_host_read("/nonexistent-root", &h);
    if (h.hp_kb || h.avail_kb || h.hugetlbfs_dir[0] || h.dev_shm_thp || h.shmem_enabled[0])
        goto out;
    /* Paths: memfds by name, files in the mount with uid, hash and session. */
    snprintf(h.hugetlbfs_dir, sizeof h.hugetlbfs_dir, "/mnt/huge");
    char want[128];
    p = ll_pagekind_path(LL_PAGEKIND_MEMFD_HUGETLB, &h, root, "s1");
    if (!p || strcmp(p, "memfd:hugetlb") != 0)
        goto out;
    free(p);
    p = ll_pagekind_path(LL_PAGEKIND_MEMFD_THP, &h, root, "s1");
    if (!p || strcmp(p, "memfd:thp") != 0)
        goto out;
    free(p);
    snprintf(want, sizeof want, "/mnt/huge/looseleaf-%u-", (unsigned) geteuid());
    p = ll_pagekind_path(LL_PAGEKIND_HUGETLBFS, &h, root, "s1");
    if (!p || strncmp(p, want, strlen(want)) != 0 || strcmp(p + strlen(p) - 8, "-s1.pool") != 0)
        goto out;
    free(p);
    snprintf(want, sizeof want, "/dev/shm/looseleaf-%u-", (unsigned) geteuid());
    p = ll_pagekind_path(LL_PAGEKIND_SHM_FILE, &h, root, "s.2");
    if (!p || strncmp(p, want, strlen(want)) != 0 || strcmp(p + strlen(p) - 9, "-s.2.pool") != 0 ||
        strlen(p) != strlen(want) + 8 + 9)
        goto out;
    free(p);
    p = ll_pagekind_path(LL_PAGEKIND_NONE, &h, root, "s1");
    rc = p ? -1 : 0;
out:
    if (rc != 0)
        fprintf(stderr, "ll_pagekind selftest: reading facts or making paths failed (%s)\n",
                p ? p : "");
    free(p);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "ll_pagekind selftest: could not remove %s\n", root);
    return rc;
}

int ll_pagekind_selftest(bool verbose)
{
    if (s_choose_cases(verbose) != 0 || s_read_cases() != 0)
        return 1;
    return 0;
}
