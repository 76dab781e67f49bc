/* ll_analysis_selftest: the C self-test of the cell analysis, run by
 * build/ll_selftest (single-threaded).  Starts an embedded Python when none
 * is running and finalizes it again, so later self-tests start clean.  The
 * large table-driven corpus is tests/analysis/corpus.txt (test_analysis_corpus.py, through
 * the CLI); here are the API's contracts, the paper's five-cell notebook and
 * the bad inputs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "analysis/ll_analysis.h"
#include "analysis/ll_analysis_internal.h"
#include "kernel/ll_interp.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int s_failures;
static bool s_verbose;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "\n  %s:%d: check failed: %s", __FILE__, __LINE__, #cond); \
            s_failures++;                                                              \
        }                                                                              \
    } while (0)

/* "a,b,c" (sorted or in order) equals the list. */
static bool s_same(ll_analysis_strs_t l, const char *expect)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", expect);
    size_t n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (size_t i = 0; i < l.count; i++)
            if (strcmp(l.items[i], tok) == 0)
                found = true;
        if (!found)
            goto differ;
        n++;
    }
    if (n == l.count)
        return true;
differ:
    fprintf(stderr, "\n  expected {%s}, got {", expect);
    for (size_t i = 0; i < l.count; i++)
        fprintf(stderr, "%s%s", i ? "," : "", l.items[i]);
    fprintf(stderr, "}");
    return false;
}

static ll_analysis_t *s_new(const char *code)
{
    ll_analysis_t *a = ll_analysis_new(code, strlen(code));
    if (a && s_verbose && ll_analysis_error(a))
        fprintf(stderr, "\n  [%s]", ll_analysis_error(a));
    return a;
}

static void s_test_names(void)
{
    ll_names_t n = {0};
    char buf[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(buf, sizeof buf, "n%d", i % 500);
        CHECK(ll_names_add(&n, buf) == (i < 500 ? 1 : 0));
    }
    CHECK(n.count == 500);
    CHECK(ll_names_has(&n, "n499") && !ll_names_has(&n, "n500"));
    ll_names_remove(&n, "n3");
    CHECK(n.count == 499 && !ll_names_has(&n, "n3") && ll_names_has(&n, "n4"));
    CHECK(ll_names_find(&n, "n4") == 3);
    ll_names_clear(&n);
    CHECK(n.count == 0 && !ll_names_has(&n, "n4"));
}

static void s_test_facts(void)
{
    ll_analysis_t *a = s_new("import numpy as np\n"
                             "from os import path as p\n"
                             "x = np.zeros(3) + y\n"
                             "def f(a, b=z):\n"
                             "    global g\n"
                             "    g = a + w\n"
                             "    return [q for q in a if q > k]\n"
                             "class C(Base):\n"
                             "    attr = v\n"
                             "    def m(self):\n"
                             "        return attr + u\n"
                             "x.shape = 3\n"
                             "lst[0] = f(1)\n");
    CHECK(a && !ll_analysis_error(a));
    if (!a)
        return;
    CHECK(s_same(ll_analysis_defs(a), "np,p,x,f,C"));
    /* f(1) is called: its globals w, k are read too (g is assigned). */
    CHECK(s_same(ll_analysis_reads(a), "y,z,Base,v,lst,w,k"));
    CHECK(s_same(ll_analysis_mutates(a), "x,lst"));
    CHECK(s_same(ll_analysis_imports(a), "numpy,os"));
    CHECK(ll_analysis_function_count(a) == 2);
    CHECK(s_same(ll_analysis_function_globals(a, 0), "w,k"));
    /* class attributes are invisible to methods: attr is a global read */
    CHECK(s_same(ll_analysis_function_globals(a, 1), "attr,u"));
    CHECK(ll_analysis_function_is_class(a, 1));
    CHECK(!ll_analysis_is_opaque(a));
    json_t *j = ll_analysis_json(a);
    CHECK(j && json_array_size(json_object_get(j, "defs")) == 5);
    json_decref(j);
    ll_analysis_destroy(&a);
    CHECK(a == NULL);
    ll_analysis_destroy(&a); /* safe twice */
}

static const char *s_paper[] = {
    "import numpy as np\n"
    "import torch\n"
    "from datasets import load_dataset\n"
    "from transformers import (AutoTokenizer, AutoModelForSequenceClassification,\n"
    "                          TrainingArguments, Trainer)\n",

    "raw = load_dataset('imdb')\n"
    "tokenizer = AutoTokenizer.from_pretrained('bert-base-uncased')\n"
    "def tokenize(batch):\n"
    "    return tokenizer(batch['text'], truncation=True, padding='max_length')\n"
    "train_ds = raw['train'].shuffle(seed=0).select(range(2000)).map(tokenize, batched=True)\n"
    "val_ds = raw['test'].shuffle(seed=0).select(range(500)).map(tokenize, batched=True)\n",

    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    "model = AutoModelForSequenceClassification.from_pretrained(\n"
    "    'bert-base-uncased', num_labels=2).to(device)\n",

    "rank_w = np.array([1.0, 0.5, 1 / 3])\n"
    "def compute_map3(eval_pred):\n"
    "    logits, labels = eval_pred\n"
    "    top3 = np.argsort(-logits, axis=1)[:, :3]\n"
    "    hits = top3 == labels[:, None]\n"
    "    return {'map@3': float((hits * rank_w).sum(axis=1).mean())}\n"
    "args = TrainingArguments(output_dir='out', num_train_epochs=1,\n"
    "                         per_device_train_batch_size=16)\n",

    "trainer = Trainer(model=model, args=args, train_dataset=train_ds,\n"
    "                  eval_dataset=val_ds, tokenizer=tokenizer,\n"
    "                  compute_metrics=compute_map3)\n"
    "trainer.train()\n",
};

static void s_test_paper(void)
{
    ll_analysis_session_t *s = ll_analysis_session_new();
    CHECK(s);
    if (!s)
        return;
    ll_analysis_closure_t *c5 = NULL;
    for (size_t i = 0; i < 5; i++) {
        ll_analysis_t *a = s_new(s_paper[i]);
        CHECK(a && !ll_analysis_error(a));
        if (!a)
            break;
        ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
        CHECK(c);
        if (i == 0 && c) /* imports alone use nothing: CPU */
            CHECK(ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
        if (i == 4)
            c5 = c;
        else
            ll_analysis_closure_destroy(&c);
        CHECK(ll_analysis_session_record(s, a) == 0);
        ll_analysis_destroy(&a);
    }
    CHECK(c5);
    if (c5) {
        CHECK(s_same(ll_analysis_closure_state(c5),
                     "tokenizer,train_ds,val_ds,model,args,compute_map3,rank_w"));
        CHECK(s_same(ll_analysis_closure_imports(c5), "datasets,transformers,torch,numpy"));
        CHECK(ll_analysis_closure_label(c5) == LL_ANALYSIS_GPU);
        CHECK(!ll_analysis_closure_is_opaque(c5));
        CHECK(ll_analysis_closure_live_count(c5) == 10);
        CHECK(s_same(ll_analysis_closure_import_stmts(c5),
                     "from transformers import Trainer,import numpy as np"));
        ll_analysis_closure_destroy(&c5);
    }
    /* A later cell that only uses the trainer still needs compute_map3's
     * globals (the trainer holds the function) and tokenize's (it holds the
     * datasets, which may hold the function they were mapped with). */
    ll_analysis_t *a = s_new("trainer.evaluate()\n");
    ll_analysis_closure_t *c = a ? ll_analysis_session_closure(s, a) : NULL;
    CHECK(c && s_same(ll_analysis_closure_state(c), "trainer,rank_w,tokenizer"));
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    CHECK(ll_analysis_session_cells(s) == 5);
    ll_analysis_session_destroy(&s);
    CHECK(s == NULL);
}

static void s_test_session(void)
{
    ll_analysis_session_t *s = ll_analysis_session_new();
    const char *cells[] = {"x = 1\ny = 2\n", "def f():\n    return x\n", "x = 5\ndel y\n",
                           "%%cpu\nz = f()\n"};
    for (size_t i = 0; i < 4; i++) {
        ll_analysis_t *a = s_new(cells[i]);
        CHECK(a && ll_analysis_session_record(s, a) == 0);
        ll_analysis_destroy(&a);
    }
    CHECK(ll_analysis_session_live_count(s) == 3); /* x, f, z */
    ll_analysis_t *a = s_new("%%gpu\nprint(z, y)\n");
    ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
    /* z was built by calling f, so it may hold code that reads x */
    CHECK(c && s_same(ll_analysis_closure_state(c), "z,x"));
    CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_GPU);
    CHECK(ll_analysis_forced_label(a) == LL_ANALYSIS_GPU);
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    a = s_new("exec('print(x)')\n");
    c = ll_analysis_session_closure(s, a);
    CHECK(c && ll_analysis_closure_is_opaque(c));
    CHECK(c && s_same(ll_analysis_closure_state(c), "x,f,z"));
    CHECK(c && !ll_analysis_closure_is_kernel_bound(c));
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    /* comm machinery keeps a cell in the kernel though it uses torch */
    a = s_new("import torch\nimport ipywidgets\nw = "
              "ipywidgets.IntSlider(max=int(torch.ones(3).sum()))\n");
    c = ll_analysis_session_closure(s, a);
    CHECK(c && ll_analysis_closure_is_kernel_bound(c) &&
          ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    ll_analysis_session_destroy(&s);
}

static void s_test_bad_input(void)
{
    ll_analysis_t *a = ll_analysis_new("", 0);
    CHECK(a && !ll_analysis_error(a) && ll_analysis_defs(a).count == 0);
    ll_analysis_destroy(&a);

    a = ll_analysis_new("x = 1\0y = 2", 11);
    CHECK(a && ll_analysis_error(a) && strstr(ll_analysis_error(a), "null"));
    ll_analysis_destroy(&a);

    a = s_new("x = '\xff\xfe'\n");
    CHECK(a && ll_analysis_error(a));
    ll_analysis_destroy(&a);

    a = s_new("def f(:\n");
    CHECK(a && ll_analysis_error(a) && strstr(ll_analysis_error(a), "line 1"));
    ll_analysis_destroy(&a);

    char *deep = malloc(1000);
    if (deep) {
        size_t n = 0;
        n += (size_t) sprintf(deep, "x = ");
        for (int i = 0; i < 200; i++)
            deep[n++] = '(';
        deep[n++] = '1';
        for (int i = 0; i < 200; i++)
            deep[n++] = ')';
        deep[n] = '\0';
        a = s_new(deep);
        CHECK(a); /* a verdict or an error, not a crash */
        ll_analysis_destroy(&a);
        free(deep);
    }

    /* 1 MB: many statements, and one huge expression */
    size_t big = 1 << 20;
    char *src = malloc(big + 64);
    if (src) {
        size_t n = 0;
        for (size_t i = 0; n + 16 < big; i++)
            n += (size_t) sprintf(src + n, "v%zu = w + 1\n", i % 1000);
        a = ll_analysis_new(src, n);
        CHECK(a && !ll_analysis_error(a));
        CHECK(a && ll_analysis_defs(a).count == 1000);
        ll_analysis_destroy(&a);
        n = (size_t) sprintf(src, "x = 0");
        while (n + 8 < big)
            n += (size_t) sprintf(src + n, "+y");
        a = ll_analysis_new(src, n);
        CHECK(a); /* RecursionError from CPython or from the walker */
        ll_analysis_destroy(&a);
        free(src);
    }
}

static void s_test_config_and_contracts(void)
{
    CHECK(ll_analysis_is_gpu_module("torch"));
    CHECK(ll_analysis_is_gpu_module("torch.nn.functional"));
    CHECK(ll_analysis_is_gpu_module("numba.cuda"));
    CHECK(!ll_analysis_is_gpu_module("numba"));
    CHECK(!ll_analysis_is_gpu_module("torchx")); /* a prefix is not a package */
    CHECK(!ll_analysis_is_gpu_module("selftestgpu"));
    CHECK(ll_analysis_gpu_add("selftestgpu") == 0);
    CHECK(ll_analysis_gpu_add("") == -1);
    CHECK(ll_analysis_is_gpu_module("selftestgpu.sub"));

    ll_analysis_session_t *s = ll_analysis_session_new();
    ll_analysis_t *a = s_new("import selftestgpu\nselftestgpu.go()\n");
    ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
    CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_GPU);
    json_t *j = c ? ll_analysis_closure_json(c) : NULL;
    CHECK(j && strcmp(json_string_value(json_object_get(j, "label")), "gpu") == 0);
    json_decref(j);
    ll_analysis_closure_destroy(&c);
    ll_analysis_closure_destroy(&c); /* safe twice */
    ll_analysis_destroy(&a);

    /* A cell that did not parse has no closure and records nothing. */
    a = s_new("def (:\n");
    CHECK(a && ll_analysis_error(a));
    CHECK(ll_analysis_session_closure(s, a) == NULL);
    CHECK(ll_analysis_session_record(s, a) == 0);
    CHECK(ll_analysis_session_cells(s) == 0);
    CHECK(ll_analysis_defs(a).count == 0 && ll_analysis_reads(a).count == 0);
    j = ll_analysis_json(a);
    CHECK(j && json_is_string(json_object_get(j, "error")));
    json_decref(j);
    ll_analysis_destroy(&a);

    a = s_new("def f():\n    return 1\n");
    CHECK(ll_analysis_function_name(a, 1) == NULL);
    CHECK(ll_analysis_function_globals(a, 7).count == 0);
    CHECK(ll_analysis_session_record(NULL, a) == -1);
    CHECK(ll_analysis_session_closure(NULL, a) == NULL);
    ll_analysis_destroy(&a);
    ll_analysis_session_destroy(&s);
    ll_analysis_session_destroy(&s); /* safe twice */
}

static int s_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void) sb;
    (void) flag;
    (void) ftw;
    return remove(path);
}

/* In a running IPython shell (the kernel), cells are transformed by the
 * shell's own manager, so transformers an extension registered apply.  The
 * shell's profile lives in DIR (IPython writes to it until Py_Finalize). */
static void s_test_shell_transformer(const char *dir)
{
    char script[1024];
    snprintf(script, sizeof script,
             "import os\n"
             "os.environ['IPYTHONDIR'] = '%s'\n"
             "from traitlets.config import Config\n"
             "from IPython.core.interactiveshell import InteractiveShell\n"
             "_c = Config()\n"
             "_c.HistoryManager.enabled = False\n"
             "InteractiveShell.instance(config=_c).input_transformers_cleanup.append(\n"
             "    lambda lines: [l.replace('%%llselftest', 'made = source') for l in lines])\n",
             dir);
    int rc = PyRun_SimpleString(script);
    CHECK(rc == 0);
    ll_analysis_t *a = s_new("%llselftest\n");
    CHECK(a && !ll_analysis_error(a));
    CHECK(a && s_same(ll_analysis_defs(a), "made") && s_same(ll_analysis_reads(a), "source"));
    CHECK(a && !ll_analysis_is_opaque(a));
    ll_analysis_destroy(&a);
    /* (the shell made itself __main__: nothing from the first script is
     * visible here) */
    rc = PyRun_SimpleString("from IPython.core.interactiveshell import InteractiveShell\n"
                            "InteractiveShell.clear_instance()\n");
    CHECK(rc == 0);
}

int ll_analysis_selftest(bool verbose)
{
    s_verbose = verbose;
    s_failures = 0;
    bool started = !Py_IsInitialized();
    char err[256];
    if (ll_interp_start_python("ll_selftest", err, sizeof err) != 0 ||
        ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "\n  %s", err);
        return 1;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    s_test_names();
    s_test_facts();
    s_test_paper();
    s_test_session();
    s_test_bad_input();
    s_test_config_and_contracts();
    char dir[] = "/tmp/ll-analysis-selftest-XXXXXX";
    /* never install a shell in someone else's interpreter */
    bool shell = started && mkdtemp(dir) != NULL;
    if (shell)
        s_test_shell_transformer(dir);
    ll_analysis_shutdown();
    PyGILState_Release(gil);
    if (started)
        Py_FinalizeEx();
    if (shell)
        nftw(dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
    return s_failures ? 1 : 0;
}
