/* ll_analysis_modules: which modules the cell analysis treats specially:
 * the GPU frameworks, whose use labels a cell GPU, and the comm
 * machinery (comm, ipykernel, ipywidgets), whose use keeps a cell in the
 * kernel; and the top-level package of a module path.  Pure C, no Python:
 * runs wherever the analysis runs (the gateway's shell thread, or the
 * `looseleaf analyze` CLI).  The GPU list grows (ll_analysis_gpu_add,
 * LOOSELEAF_GPU_PACKAGES read by ll_analysis_init) but never shrinks; like
 * the rest of the analysis it is not thread-safe.
 *
 * A list entry is a package ("torch") or a dotted module path
 * ("numba.cuda"); a module matches an entry when it is the entry or one of
 * its submodules, never a mere prefix ("torchx" is not "torch"). */
#include "analysis/ll_analysis.h"
#include "analysis/ll_analysis_internal.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <string.h>

/* The GPU frameworks (package names or dotted module paths). */
static const char *const s_gpu_builtin[] = {"torch",
                                            "torchvision",
                                            "torchaudio",
                                            "torchtext",
                                            "transformers",
                                            "accelerate",
                                            "peft",
                                            "bitsandbytes",
                                            "tensorflow",
                                            "keras",
                                            "jax",
                                            "jaxlib",
                                            "flax",
                                            "optax",
                                            "cupy",
                                            "cupyx",
                                            "numba.cuda",
                                            "triton",
                                            "xformers",
                                            "deepspeed",
                                            "diffusers",
                                            "lightning",
                                            "pytorch_lightning",
                                            "torch_geometric",
                                            "dgl",
                                            "vllm",
                                            "sentence_transformers",
                                            "timm",
                                            "trl",
                                            "apex",
                                            "cudf",
                                            "cuml",
                                            "cugraph",
                                            "rapids",
                                            "pycuda",
                                            "mxnet",
                                            "paddle",
                                            "onnxruntime_gpu",
                                            "tensorrt",
                                            "flash_attn",
                                            "unsloth",
                                            "fastai",
                                            "detectron2",
                                            "mmcv",
                                            "ultralytics",
                                            NULL};
static ll_names_t s_gpu_extra;

int ll_analysis_gpu_add_list(const char *list)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", \t\n:;", &save); tok; tok = strtok_r(NULL, ", \t\n:;", &save))
        if (ll_analysis_gpu_add(tok) != 0)
            return -1;
    return 0;
}

int ll_analysis_gpu_add(const char *package)
{
    if (!package || !*package)
        return -1;
    return ll_names_add(&s_gpu_extra, package) < 0 ? -1 : 0;
}

/* Whether module PATH is ENTRY (a package or a dotted module path) or one
 * of its submodules. */
static bool s_module_match(const char *path, const char *entry)
{
    size_t n = strlen(entry);
    return strncmp(path, entry, n) == 0 && (path[n] == '\0' || path[n] == '.');
}

bool ll_analysis_is_gpu_module(const char *path)
{
    if (!path)
        return false;
    for (const char *const *e = s_gpu_builtin; *e; e++)
        if (s_module_match(path, *e))
            return true;
    for (size_t i = 0; i < s_gpu_extra.count; i++)
        if (s_module_match(path, s_gpu_extra.items[i]))
            return true;
    return false;
}

bool ll_analysis_is_kernel_module(const char *path)
{
    /* Comms live in the process that made them and answer the frontend's
     * messages there; ipywidgets and ipykernel's own comm API are built on
     * them.  (tqdm.notebook's one-way progress bars work from a worker.) */
    static const char *const kernel_side[] = {"comm", "ipykernel", "ipywidgets", NULL};
    if (!path)
        return false;
    for (const char *const *e = kernel_side; *e; e++)
        if (s_module_match(path, *e))
            return true;
    return false;
}

const char *ll_analysis_package_of(const char *path, char *buf, size_t buflen)
{
    if (!path || !*path || path[0] == '.')
        return NULL;
    size_t n = strcspn(path, ".");
    if (n == 0 || n >= buflen)
        return NULL;
    memcpy(buf, path, n);
    buf[n] = '\0';
    if (strcmp(buf, "__future__") == 0)
        return NULL;
    return buf;
}

/* ---- self-test: the list decisions, scripted --------------------------- */

int ll_analysis_modules_selftest(bool verbose)
{
    int fails = 0;
    /* A package matches itself and its submodules, not a longer name. */
    S_CHECK(ll_analysis_is_gpu_module("torch"));
    S_CHECK(ll_analysis_is_gpu_module("torch.nn.functional"));
    S_CHECK(!ll_analysis_is_gpu_module("torchx"));
    S_CHECK(!ll_analysis_is_gpu_module("torch_"));
    S_CHECK(!ll_analysis_is_gpu_module("xtorch"));
    S_CHECK(!ll_analysis_is_gpu_module(NULL));
    S_CHECK(!ll_analysis_is_gpu_module(""));
    /* A dotted entry matches below it only: numba itself is a CPU JIT. */
    S_CHECK(ll_analysis_is_gpu_module("numba.cuda"));
    S_CHECK(ll_analysis_is_gpu_module("numba.cuda.random"));
    S_CHECK(!ll_analysis_is_gpu_module("numba"));
    S_CHECK(!ll_analysis_is_gpu_module("numba.cudax"));
    S_CHECK(!ll_analysis_is_gpu_module("numpy"));

    /* Added entries: one at a time, or a list split at , ; : and blanks. */
    S_CHECK(!ll_analysis_is_gpu_module("llmodtest_a"));
    S_CHECK(ll_analysis_gpu_add("llmodtest_a") == 0);
    S_CHECK(ll_analysis_gpu_add("llmodtest_a") == 0); /* twice: no error */
    S_CHECK(ll_analysis_gpu_add("") == -1 && ll_analysis_gpu_add(NULL) == -1);
    S_CHECK(ll_analysis_is_gpu_module("llmodtest_a.sub"));
    S_CHECK(ll_analysis_gpu_add_list("llmodtest_b, llmodtest_c.gpu;llmodtest_d\tllmodtest_e:") ==
            0);
    S_CHECK(ll_analysis_is_gpu_module("llmodtest_b") && ll_analysis_is_gpu_module("llmodtest_d"));
    S_CHECK(ll_analysis_is_gpu_module("llmodtest_e.x"));
    S_CHECK(ll_analysis_is_gpu_module("llmodtest_c.gpu.k") &&
            !ll_analysis_is_gpu_module("llmodtest_c"));
    S_CHECK(ll_analysis_gpu_add_list(" , ;") == 0); /* nothing to add */

    /* Comm machinery: widgets and comms belong to the kernel process. */
    S_CHECK(ll_analysis_is_kernel_module("ipywidgets"));
    S_CHECK(ll_analysis_is_kernel_module("ipywidgets.widgets.interaction"));
    S_CHECK(ll_analysis_is_kernel_module("comm") && ll_analysis_is_kernel_module("ipykernel.comm"));
    S_CHECK(!ll_analysis_is_kernel_module("commons") &&
            !ll_analysis_is_kernel_module("tqdm.notebook"));
    S_CHECK(!ll_analysis_is_kernel_module(NULL));
    S_CHECK(!ll_analysis_is_kernel_module("torch") && !ll_analysis_is_gpu_module("ipywidgets"));

    /* The package of a path: its first component; none for a relative
     * import, __future__, or a name that does not fit the buffer. */
    char buf[16];
    const char *pkg = ll_analysis_package_of("a.b.c", buf, sizeof buf);
    S_CHECK(pkg && strcmp(pkg, "a") == 0);
    pkg = ll_analysis_package_of("numpy", buf, sizeof buf);
    S_CHECK(pkg && strcmp(pkg, "numpy") == 0);
    S_CHECK(ll_analysis_package_of(".sibling", buf, sizeof buf) == NULL);
    S_CHECK(ll_analysis_package_of("..", buf, sizeof buf) == NULL);
    S_CHECK(ll_analysis_package_of("__future__", buf, sizeof buf) == NULL);
    S_CHECK(ll_analysis_package_of("", buf, sizeof buf) == NULL);
    S_CHECK(ll_analysis_package_of(NULL, buf, sizeof buf) == NULL);
    S_CHECK(ll_analysis_package_of("averyveryverylongname.x", buf, sizeof buf) == NULL);
    S_CHECK(ll_analysis_package_of("exactly15chars_", buf, sizeof buf) != NULL);
    S_CHECK(ll_analysis_package_of("exactly16chars__", buf, sizeof buf) == NULL);
    return fails ? 1 : 0;
}
