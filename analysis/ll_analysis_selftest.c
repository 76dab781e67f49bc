/* ll_analysis_selftest: the C self-test of the cell analysis, run by
 * build/ll_selftest (single-threaded).  Starts an embedded Python when none
 * is running and finalizes it again, so later self-tests start clean.  The
 * large table-driven corpus is tests/analysis/corpus.txt (test_analysis_corpus.py, through
 * the CLI); here are the API's contracts, the paper's five-cell notebook and
 * the bad inputs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "analysis/ll_analysis.h"
#include "base/ll_check.h"
#include "analysis/ll_analysis_internal.h"
#include "kernel/ll_interp.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static bool s_verbose;

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

static int s_test_names(void)
{
    int fails = 0;
    ll_names_t n = {0};
    char buf[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(buf, sizeof buf, "n%d", i % 500);
        S_CHECK(ll_names_add(&n, buf) == (i < 500 ? 1 : 0));
    }
    S_CHECK(n.count == 500);
    S_CHECK(ll_names_has(&n, "n499") && !ll_names_has(&n, "n500"));
    ll_names_remove(&n, "n3");
    S_CHECK(n.count == 499 && !ll_names_has(&n, "n3") && ll_names_has(&n, "n4"));
    S_CHECK(ll_names_find(&n, "n4") == 3);
    ll_names_clear(&n);
    S_CHECK(n.count == 0 && !ll_names_has(&n, "n4"));
    return fails;
}

static int s_test_facts(void)
{
    int fails = 0;
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
    S_CHECK(a && !ll_analysis_error(a));
    if (!a)
        return fails;
    S_CHECK(s_same(ll_analysis_defs(a), "np,p,x,f,C"));
    /* f(1) is called: its globals w, k are read too (g is assigned). */
    S_CHECK(s_same(ll_analysis_reads(a), "y,z,Base,v,lst,w,k"));
    S_CHECK(s_same(ll_analysis_mutates(a), "x,lst"));
    S_CHECK(s_same(ll_analysis_imports(a), "numpy,os"));
    S_CHECK(ll_analysis_function_count(a) == 2);
    S_CHECK(s_same(ll_analysis_function_globals(a, 0), "w,k"));
    /* class attributes are invisible to methods: attr is a global read */
    S_CHECK(s_same(ll_analysis_function_globals(a, 1), "attr,u"));
    S_CHECK(ll_analysis_function_is_class(a, 1));
    S_CHECK(!ll_analysis_is_opaque(a));
    json_t *j = ll_analysis_json(a);
    S_CHECK(j && json_array_size(json_object_get(j, "defs")) == 5);
    json_decref(j);
    ll_analysis_destroy(&a);
    S_CHECK(a == NULL);
    ll_analysis_destroy(&a); /* safe twice */
    return fails;
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

static int s_test_paper(void)
{
    int fails = 0;
    ll_analysis_session_t *s = ll_analysis_session_new();
    S_CHECK(s);
    if (!s)
        return fails;
    ll_analysis_closure_t *c5 = NULL;
    for (size_t i = 0; i < 5; i++) {
        ll_analysis_t *a = s_new(s_paper[i]);
        S_CHECK(a && !ll_analysis_error(a));
        if (!a)
            break;
        ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
        S_CHECK(c);
        if (i == 0 && c) /* imports alone use nothing: CPU */
            S_CHECK(ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
        if (i == 4)
            c5 = c;
        else
            ll_analysis_closure_destroy(&c);
        S_CHECK(ll_analysis_session_record(s, a) == 0);
        ll_analysis_destroy(&a);
    }
    S_CHECK(c5);
    if (c5) {
        S_CHECK(s_same(ll_analysis_closure_state(c5),
                       "tokenizer,train_ds,val_ds,model,args,compute_map3,rank_w"));
        S_CHECK(s_same(ll_analysis_closure_imports(c5), "datasets,transformers,torch,numpy"));
        S_CHECK(ll_analysis_closure_label(c5) == LL_ANALYSIS_GPU);
        S_CHECK(!ll_analysis_closure_is_opaque(c5));
        S_CHECK(ll_analysis_closure_live_count(c5) == 10);
        S_CHECK(s_same(ll_analysis_closure_import_stmts(c5),
                       "from transformers import Trainer,import numpy as np"));
        ll_analysis_closure_destroy(&c5);
    }
    /* A later cell that only uses the trainer still needs compute_map3's
     * globals (the trainer holds the function) and tokenize's (it holds the
     * datasets, which may hold the function they were mapped with). */
    ll_analysis_t *a = s_new("trainer.evaluate()\n");
    ll_analysis_closure_t *c = a ? ll_analysis_session_closure(s, a) : NULL;
    S_CHECK(c && s_same(ll_analysis_closure_state(c), "trainer,rank_w,tokenizer"));
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    S_CHECK(ll_analysis_session_cells(s) == 5);
    ll_analysis_session_destroy(&s);
    S_CHECK(s == NULL);
    return fails;
}

static int s_test_session(void)
{
    int fails = 0;
    ll_analysis_session_t *s = ll_analysis_session_new();
    const char *cells[] = {"x = 1\ny = 2\n", "def f():\n    return x\n", "x = 5\ndel y\n",
                           "%%cpu\nz = f()\n"};
    for (size_t i = 0; i < 4; i++) {
        ll_analysis_t *a = s_new(cells[i]);
        S_CHECK(a && ll_analysis_session_record(s, a) == 0);
        ll_analysis_destroy(&a);
    }
    S_CHECK(ll_analysis_session_live_count(s) == 3); /* x, f, z */
    ll_analysis_t *a = s_new("%%gpu\nprint(z, y)\n");
    ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
    /* z was built by calling f, so it may hold code that reads x */
    S_CHECK(c && s_same(ll_analysis_closure_state(c), "z,x"));
    S_CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_GPU);
    S_CHECK(ll_analysis_forced_label(a) == LL_ANALYSIS_GPU);
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    a = s_new("exec('print(x)')\n");
    c = ll_analysis_session_closure(s, a);
    S_CHECK(c && ll_analysis_closure_is_opaque(c));
    S_CHECK(c && s_same(ll_analysis_closure_state(c), "x,f,z"));
    S_CHECK(c && !ll_analysis_closure_is_kernel_bound(c));
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    /* comm machinery keeps a cell in the kernel though it uses torch */
    a = s_new("import torch\nimport ipywidgets\nw = "
              "ipywidgets.IntSlider(max=int(torch.ones(3).sum()))\n");
    c = ll_analysis_session_closure(s, a);
    S_CHECK(c && ll_analysis_closure_is_kernel_bound(c) &&
            ll_analysis_closure_label(c) == LL_ANALYSIS_CPU);
    ll_analysis_closure_destroy(&c);
    ll_analysis_destroy(&a);
    ll_analysis_session_destroy(&s);
    return fails;
}

static int s_test_bad_input(void)
{
    int fails = 0;
    ll_analysis_t *a = ll_analysis_new("", 0);
    S_CHECK(a && !ll_analysis_error(a) && ll_analysis_defs(a).count == 0);
    ll_analysis_destroy(&a);

    a = ll_analysis_new("x = 1\0y = 2", 11);
    S_CHECK(a && ll_analysis_error(a) && strstr(ll_analysis_error(a), "null"));
    ll_analysis_destroy(&a);

    a = s_new("x = '\xff\xfe'\n");
    S_CHECK(a && ll_analysis_error(a));
    ll_analysis_destroy(&a);

    a = s_new("def f(:\n");
    S_CHECK(a && ll_analysis_error(a) && strstr(ll_analysis_error(a), "line 1"));
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
        S_CHECK(a); /* a verdict or an error, not a crash */
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
        S_CHECK(a && !ll_analysis_error(a));
        S_CHECK(a && ll_analysis_defs(a).count == 1000);
        ll_analysis_destroy(&a);
        n = (size_t) sprintf(src, "x = 0");
        while (n + 8 < big)
            n += (size_t) sprintf(src + n, "+y");
        a = ll_analysis_new(src, n);
        S_CHECK(a); /* RecursionError from CPython or from the walker */
        ll_analysis_destroy(&a);
        free(src);
    }
    return fails;
}

static int s_test_config_and_contracts(void)
{
    int fails = 0;
    S_CHECK(ll_analysis_is_gpu_module("torch"));
    S_CHECK(ll_analysis_is_gpu_module("torch.nn.functional"));
    S_CHECK(ll_analysis_is_gpu_module("numba.cuda"));
    S_CHECK(!ll_analysis_is_gpu_module("numba"));
    S_CHECK(!ll_analysis_is_gpu_module("torchx")); /* a prefix is not a package */
    S_CHECK(!ll_analysis_is_gpu_module("selftestgpu"));
    S_CHECK(ll_analysis_gpu_add("selftestgpu") == 0);
    S_CHECK(ll_analysis_gpu_add("") == -1);
    S_CHECK(ll_analysis_is_gpu_module("selftestgpu.sub"));

    ll_analysis_session_t *s = ll_analysis_session_new();
    ll_analysis_t *a = s_new("import selftestgpu\nselftestgpu.go()\n");
    ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
    S_CHECK(c && ll_analysis_closure_label(c) == LL_ANALYSIS_GPU);
    json_t *j = c ? ll_analysis_closure_json(c) : NULL;
    S_CHECK(j && strcmp(json_string_value(json_object_get(j, "label")), "gpu") == 0);
    json_decref(j);
    ll_analysis_closure_destroy(&c);
    ll_analysis_closure_destroy(&c); /* safe twice */
    ll_analysis_destroy(&a);

    /* A cell that did not parse has no closure and records nothing. */
    a = s_new("def (:\n");
    S_CHECK(a && ll_analysis_error(a));
    S_CHECK(ll_analysis_session_closure(s, a) == NULL);
    S_CHECK(ll_analysis_session_record(s, a) == 0);
    S_CHECK(ll_analysis_session_cells(s) == 0);
    S_CHECK(ll_analysis_defs(a).count == 0 && ll_analysis_reads(a).count == 0);
    j = ll_analysis_json(a);
    S_CHECK(j && json_is_string(json_object_get(j, "error")));
    json_decref(j);
    ll_analysis_destroy(&a);

    a = s_new("def f():\n    return 1\n");
    S_CHECK(ll_analysis_function_name(a, 1) == NULL);
    S_CHECK(ll_analysis_function_globals(a, 7).count == 0);
    S_CHECK(ll_analysis_session_record(NULL, a) == -1);
    S_CHECK(ll_analysis_session_closure(NULL, a) == NULL);
    ll_analysis_destroy(&a);
    ll_analysis_session_destroy(&s);
    ll_analysis_session_destroy(&s); /* safe twice */
    return fails;
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
static int s_test_shell_transformer(const char *dir)
{
    int fails = 0;
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
    S_CHECK(rc == 0);
    ll_analysis_t *a = s_new("%llselftest\n");
    S_CHECK(a && !ll_analysis_error(a));
    S_CHECK(a && s_same(ll_analysis_defs(a), "made") && s_same(ll_analysis_reads(a), "source"));
    S_CHECK(a && !ll_analysis_is_opaque(a));
    ll_analysis_destroy(&a);
    /* (the shell made itself __main__: nothing from the first script is
     * visible here) */
    rc = PyRun_SimpleString("from IPython.core.interactiveshell import InteractiveShell\n"
                            "InteractiveShell.clear_instance()\n");
    S_CHECK(rc == 0);
    return fails;
}

int ll_analysis_selftest(bool verbose)
{
    s_verbose = verbose;
    int fails = 0;
    bool started = !Py_IsInitialized();
    char err[256];
    if (ll_interp_start_python("ll_selftest", err, sizeof err) != 0 ||
        ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "\n  %s", err);
        return 1;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    fails += s_test_names();
    fails += s_test_facts();
    fails += s_test_paper();
    fails += s_test_session();
    fails += s_test_bad_input();
    fails += s_test_config_and_contracts();
    char dir[] = "/tmp/ll-analysis-selftest-XXXXXX";
    /* never install a shell in someone else's interpreter */
    bool shell = started && mkdtemp(dir) != NULL;
    if (shell)
        fails += s_test_shell_transformer(dir);
    ll_analysis_shutdown();
    PyGILState_Release(gil);
    if (started)
        Py_FinalizeEx();
    if (shell)
        nftw(dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
    return fails ? 1 : 0;
}
