/* bench_analysis: how long the cell analysis takes (make bench).
 * Prints one JSON object: microseconds per analysis of a typical 30-line
 * cell, per closure query in a session of 500 executed cells, and per
 * recorded cell.  tests/bench/bench_analysis.py runs this and the pure-Python
 * baseline and prints the ratios.  Single-threaded, embedded Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "base/ll_clock.h"
#include "analysis/ll_analysis.h"
#include "base/ll_log.h"
#include "kernel/ll_interp.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A typical 30-line training cell. */
static const char *s_cell =
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "loader = DataLoader(train_ds, batch_size=cfg['batch'], shuffle=True)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=cfg['lr'])\n"
    "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)\n"
    "history = []\n"
    "def evaluate(m, data):\n"
    "    m.eval()\n"
    "    total, correct = 0, 0\n"
    "    with torch.no_grad():\n"
    "        for xb, yb in data:\n"
    "            pred = m(xb.to(device)).argmax(dim=1)\n"
    "            correct += (pred == yb.to(device)).sum().item()\n"
    "            total += len(yb)\n"
    "    return correct / max(total, 1)\n"
    "for epoch in range(cfg['epochs']):\n"
    "    model.train()\n"
    "    running = 0.0\n"
    "    for step, (xb, yb) in enumerate(loader):\n"
    "        opt.zero_grad()\n"
    "        loss = loss_fn(model(xb.to(device)), yb.to(device))\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        running += loss.item()\n"
    "        if step % log_every == 0:\n"
    "            print(f'epoch {epoch} step {step} loss {running / (step + 1):.4f}')\n"
    "    sched.step()\n"
    "    acc = evaluate(model, val_loader)\n"
    "    history.append({'epoch': epoch, 'loss': running, 'acc': acc})\n"
    "print('best', max(h['acc'] for h in history))\n";

/* Cell I of a synthetic 500-cell session: a mix of imports, data cells,
 * functions reading earlier globals, classes, and re-runs of old names. */
static void s_session_cell(char *buf, size_t len, int i)
{
    switch (i % 5) {
    case 0: snprintf(buf, len, "import numpy as np%d\nv%d = np%d.arange(%d)\n", i, i, i, i); break;
    case 1: snprintf(buf, len, "v%d = v%d * 2 + w\nw = len(v%d)\n", i, i - 1, i - 1); break;
    case 2:
        snprintf(buf, len,
                 "def f%d(x):\n    return x + v%d + f%d(x) if x else v%d\n"
                 "r%d = f%d(v%d)\n",
                 i, i - 1, i > 10 ? i - 5 : i, i - 2, i, i, i - 1);
        break;
    case 3:
        snprintf(buf, len,
                 "class C%d:\n    scale = %d\n    def go(self, x):\n"
                 "        return f%d(x) * v%d\nobj%d = C%d()\n",
                 i, i, i - 1, i - 3, i, i);
        break;
    default:
        snprintf(buf, len, "res%d = [obj%d.go(k) for k in range(3)]\nv%d = None\n", i, i - 1,
                 (i * 7) % (i + 1));
        break;
    }
}

static const char *s_candidate = "out = [obj498.go(k) for k in range(10)] + [f497(v499), w]\n"
                                 "summary = sum(len(r) for r in out if r is not None)\n";

/* --dump: the inputs as JSON, so the Python baseline measures the same. */
static int s_dump(void)
{
    json_t *cells = json_array();
    char buf[512];
    for (int i = 0; i < 500; i++) {
        s_session_cell(buf, sizeof buf, i);
        json_array_append_new(cells, json_string(buf));
    }
    json_t *doc =
        json_pack("{s:s, s:o, s:s}", "cell", s_cell, "session", cells, "candidate", s_candidate);
    char *text = json_dumps(doc, 0);
    printf("%s\n", text);
    free(text);
    json_decref(doc);
    return 0;
}

int main(int argc, char **argv)
{
    ll_log_init('A');
    if (argc > 1 && strcmp(argv[1], "--dump") == 0)
        return s_dump();
    char err[256];
    if (ll_interp_start_python(argv[0], err, sizeof err) != 0 ||
        ll_analysis_init(err, sizeof err) != 0) {
        fprintf(stderr, "bench_analysis: %s\n", err);
        return 1;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    if (iters < 1)
        iters = 1;
    size_t len = strlen(s_cell);

    /* analysis of the 30-line cell */
    for (int i = 0; i < 50; i++) {
        ll_analysis_t *a = ll_analysis_new(s_cell, len);
        ll_analysis_destroy(&a);
    }
    double t0 = ll_clock_s();
    for (int i = 0; i < iters; i++) {
        ll_analysis_t *a = ll_analysis_new(s_cell, len);
        if (!a || ll_analysis_error(a)) {
            fprintf(stderr, "bench_analysis: the cell did not parse\n");
            return 1;
        }
        ll_analysis_destroy(&a);
    }
    double analyse_us = (ll_clock_s() - t0) / iters * 1e6;

    /* a session of 500 executed cells */
    ll_analysis_session_t *s = ll_analysis_session_new();
    char buf[512];
    double record_total = 0;
    for (int i = 0; i < 500; i++) {
        s_session_cell(buf, sizeof buf, i);
        ll_analysis_t *a = ll_analysis_new(buf, strlen(buf));
        double t = ll_clock_s();
        if (!a || ll_analysis_session_record(s, a) != 0) {
            fprintf(stderr, "bench_analysis: cannot record cell %d\n", i);
            return 1;
        }
        record_total += ll_clock_s() - t;
        ll_analysis_destroy(&a);
    }
    /* the candidate: reads the latest object, whose class's methods reach
     * back through the chain of functions */
    ll_analysis_t *a = ll_analysis_new(s_candidate, strlen(s_candidate));
    ll_analysis_closure_t *c = ll_analysis_session_closure(s, a);
    size_t state = c ? ll_analysis_closure_state(c).count : 0;
    ll_analysis_closure_destroy(&c);
    t0 = ll_clock_s();
    for (int i = 0; i < iters; i++) {
        c = ll_analysis_session_closure(s, a);
        if (!c)
            return 1;
        ll_analysis_closure_destroy(&c);
    }
    double closure_us = (ll_clock_s() - t0) / iters * 1e6;
    printf("{\"analyse_30_line_cell_us\": %.2f, \"closure_500_cells_us\": %.2f, "
           "\"record_cell_us\": %.2f, \"closure_size\": %zu, \"live\": %zu, "
           "\"iterations\": %d}\n",
           analyse_us, closure_us, record_total / 500 * 1e6, state,
           ll_analysis_session_live_count(s), iters);
    ll_analysis_destroy(&a);
    ll_analysis_session_destroy(&s);
    ll_analysis_shutdown();
    return 0;
}
