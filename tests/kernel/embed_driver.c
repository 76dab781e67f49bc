/* embed_driver: runs the embedded interpreter (kernel/ll_interp) without any
 * sockets, for tests/kernel/test_interp.py.
 *
 * Requests come as lines, from the command-line arguments (one per
 * argument) or else from stdin:
 *     <msg_type> <content JSON>   handle one request (parent header made up)
 *     @input <JSON string>        queue an answer for the next input request
 *     @input-interrupt            the next input request is interrupted
 *     @interrupt <ms>             after MS ms call ll_interp_interrupt()
 *     @sigint <ms>                after MS ms send SIGINT to this process
 *                                 (whose handler calls ll_interp_interrupt)
 *     @busy                       print whether ll_interp_busy()
 *     @linger <ms>                after ll_interp_finalize, wait MS ms before
 *                                 exiting (threads that outlive Python run on)
 *     @metadata <JSON object>     request metadata of the next request
 *     @buffers <hex>[,<hex>...]   binary buffers of the next request
 *     @fork <request line>        ll_interp_fork(); the child sets the hooks
 *                                 again, runs the request, exits; the parent
 *                                 waits ({"ev": "child_exit", "status"})
 *     # ...                       comment
 * Everything the hooks receive, and every reply, is printed as one JSON
 * object per line on the original stdout, with "t" = ms since start:
 *     {"ev": "stream", "name", "text"}     {"ev": "flush"}
 *     {"ev": "publish", "msg_type", "content", "metadata", "buffers" (hex)}
 *     {"ev": "input_request", "prompt", "password"}
 *     {"ev": "reply", "msg_type", "content", "metadata"}
 * File descriptor 1 itself is pointed at stderr, so raw writes by C code
 * cannot corrupt the JSON lines.
 *
 * Threads: main thread runs the interpreter; hooks may be called from Python
 * threads; timer threads fire interrupts. */
#include "kernel/ll_interp.h"
#include "base/ll_log.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *s_out;          /* the JSON lines */
static struct timespec s_t0; /* start time */
static char *s_inputs[64];   /* queued input answers; "" + flag for interrupt */
static bool s_input_intr[64];
static int s_ninputs, s_next_input;
static int s_seq;                     /* request counter for made-up msg_ids */
static char *s_next_md;               /* metadata for the next request, or NULL */
static unsigned char *s_next_bufs[8]; /* buffers for the next request */
static size_t s_next_buflens[8];
static size_t s_next_nbufs;
static int s_linger_ms; /* wait after finalize */

static double s_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) (t.tv_sec - s_t0.tv_sec) * 1e3 + (double) (t.tv_nsec - s_t0.tv_nsec) / 1e6;
}

/* Print OBJ (stolen) as one line. */
static void s_emit(json_t *obj)
{
    json_object_set_new(obj, "t", json_real(s_ms()));
    char *text = json_dumps(obj, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(obj);
    if (!text)
        return;
    pthread_mutex_lock(&s_lock);
    fprintf(s_out, "%s\n", text);
    fflush(s_out);
    pthread_mutex_unlock(&s_lock);
    free(text);
}

/* JSON text as a value, or the text itself as a string when it does not
 * parse (the test then sees what went wrong). */
static json_t *s_parse(const char *text)
{
    if (!text)
        return json_null();
    json_error_t err;
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    return v ? v : json_pack("{s:s}", "unparsable", text);
}

static void s_stream_write(void *ctx, const char *name, const char *data, size_t len)
{
    s_emit(json_pack("{s:s, s:s, s:s%}", "ev", "stream", "name", name, "text", data, len));
}

static void s_stream_flush(void *ctx)
{
    s_emit(json_pack("{s:s}", "ev", "flush"));
}

static void s_publish(void *ctx, const char *msg_type, const char *content, const char *metadata,
                      const void *const *bufs, const size_t *buflens, size_t nbufs)
{
    json_t *hex = json_array();
    for (size_t i = 0; i < nbufs; i++) {
        char *h = malloc(buflens[i] * 2 + 1);
        if (!h)
            break;
        for (size_t j = 0; j < buflens[i]; j++)
            sprintf(h + 2 * j, "%02x", ((const unsigned char *) bufs[i])[j]);
        h[buflens[i] * 2] = '\0';
        json_array_append_new(hex, json_string(h));
        free(h);
    }
    s_emit(json_pack("{s:s, s:s, s:o, s:o, s:o}", "ev", "publish", "msg_type", msg_type, "content",
                     s_parse(content), "metadata", s_parse(metadata), "buffers", hex));
}

static char *s_input_request(void *ctx, const char *prompt, bool password, int *err)
{
    s_emit(json_pack("{s:s, s:s, s:b}", "ev", "input_request", "prompt", prompt, "password",
                     password));
    if (s_next_input >= s_ninputs) {
        *err = 2;
        return NULL;
    }
    int i = s_next_input++;
    if (s_input_intr[i]) {
        *err = 1;
        return NULL;
    }
    return strdup(s_inputs[i]);
}

typedef struct {
    int ms;
    bool sigint;
} driver_timer_t;

static void *s_timer(void *arg)
{
    driver_timer_t t = *(driver_timer_t *) arg;
    free(arg);
    struct timespec ts = {t.ms / 1000, (long) (t.ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    /* Reported after the interrupt is delivered, so a test that waits for
     * this line knows no interrupt is still on its way. */
    bool busy = ll_interp_busy();
    if (t.sigint)
        kill(getpid(), SIGINT);
    else
        ll_interp_interrupt();
    s_emit(json_pack("{s:s, s:b, s:b}", "ev", t.sigint ? "sigint" : "interrupt", "busy", busy,
                     "sent", true));
    return NULL;
}

static void s_on_sigint(int sig)
{
    ll_interp_interrupt();
}

static void s_start_timer(int ms, bool sigint)
{
    driver_timer_t *t = malloc(sizeof *t);
    if (!t)
        return;
    t->ms = ms;
    t->sigint = sigint;
    pthread_t th;
    if (pthread_create(&th, NULL, s_timer, t) == 0)
        pthread_detach(th);
    else
        free(t);
}

static ll_interp_hooks_t s_hooks;

static void s_line(char *line);

static void s_fork(char *request)
{
    fflush(s_out);
    int pid = ll_interp_fork();
    if (pid < 0) {
        s_emit(json_pack("{s:s, s:b}", "ev", "fork", "ok", false));
        return;
    }
    if (pid == 0) {
        ll_interp_set_hooks(&s_hooks);
        s_emit(json_pack("{s:s, s:i}", "ev", "child", "pid", (int) getpid()));
        s_line(request);
        fflush(s_out);
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        ;
    s_emit(json_pack("{s:s, s:i}", "ev", "child_exit", "status",
                     WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)));
}

static void s_line(char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    if (!n || line[0] == '#')
        return;
    if (strncmp(line, "@input-interrupt", 16) == 0) {
        if (s_ninputs < 64) {
            s_inputs[s_ninputs] = strdup("");
            s_input_intr[s_ninputs++] = true;
        }
        return;
    }
    if (strncmp(line, "@input ", 7) == 0) {
        json_t *v = json_loads(line + 7, JSON_DECODE_ANY, NULL);
        if (s_ninputs < 64 && json_is_string(v))
            s_inputs[s_ninputs++] = strdup(json_string_value(v));
        json_decref(v);
        return;
    }
    if (strncmp(line, "@interrupt ", 11) == 0 || strncmp(line, "@sigint ", 8) == 0) {
        bool sig = line[1] == 's';
        s_start_timer(atoi(strchr(line, ' ') + 1), sig);
        return;
    }
    if (strncmp(line, "@metadata ", 10) == 0) {
        free(s_next_md);
        s_next_md = strdup(line + 10);
        return;
    }
    if (strncmp(line, "@buffers ", 9) == 0) {
        for (char *tok = strtok(line + 9, ","); tok && s_next_nbufs < 8; tok = strtok(NULL, ",")) {
            size_t nbytes = strlen(tok) / 2;
            unsigned char *b = malloc(nbytes + 1);
            for (size_t i = 0; b && i < nbytes; i++)
                sscanf(tok + 2 * i, "%2hhx", &b[i]);
            s_next_bufs[s_next_nbufs] = b;
            s_next_buflens[s_next_nbufs++] = nbytes;
        }
        return;
    }
    if (strncmp(line, "@fork ", 6) == 0) {
        s_fork(line + 6);
        return;
    }
    if (strncmp(line, "@linger ", 8) == 0) {
        s_linger_ms = atoi(line + 8);
        return;
    }
    if (strcmp(line, "@busy") == 0) {
        s_emit(json_pack("{s:s, s:b}", "ev", "busy", "busy", ll_interp_busy()));
        return;
    }
    char *sp = strchr(line, ' ');
    const char *content = "{}";
    if (sp) {
        *sp = '\0';
        content = sp + 1;
    }
    char parent[256];
    snprintf(parent, sizeof parent,
             "{\"msg_id\": \"driver-%d\", \"msg_type\": \"%s\", \"session\": \"driver\", "
             "\"username\": \"test\", \"version\": \"5.3\"}",
             ++s_seq, line);
    char *md = NULL;
    ll_interp_request_t req = {.msg_type = line,
                               .content_json = content,
                               .parent_json = parent,
                               .metadata_json = s_next_md,
                               .bufs = (const void *const *) s_next_bufs,
                               .buflens = s_next_buflens,
                               .nbufs = s_next_nbufs};
    char *reply = ll_interp_call(&req, &md);
    free(s_next_md);
    s_next_md = NULL;
    for (size_t i = 0; i < s_next_nbufs; i++)
        free(s_next_bufs[i]);
    s_next_nbufs = 0;
    s_emit(json_pack("{s:s, s:s, s:o, s:o}", "ev", "reply", "msg_type", line, "content",
                     s_parse(reply), "metadata", s_parse(md)));
    free(reply);
    free(md);
}

int main(int argc, char **argv)
{
    clock_gettime(CLOCK_MONOTONIC, &s_t0);
    ll_log_init('A');
    int fd = dup(1);
    s_out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!s_out || dup2(2, 1) < 0) {
        perror("embed_driver: stdout");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_sigint;
    sigaction(SIGINT, &sa, NULL);

    ll_interp_hooks_t hooks = {
        NULL, s_stream_write, s_stream_flush, s_publish, s_input_request, NULL, NULL};
    s_hooks = hooks;
    char err[512];
    if (ll_interp_init(argv[0], &hooks, err, sizeof err) != 0) {
        s_emit(json_pack("{s:s, s:b, s:s}", "ev", "init", "ok", false, "error", err));
        return 1;
    }
    s_emit(json_pack("{s:s, s:b}", "ev", "init", "ok", true));
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            s_line(argv[i]);
    } else {
        char *line = NULL;
        size_t cap = 0;
        while (getline(&line, &cap, stdin) > 0)
            s_line(line);
        free(line);
    }
    ll_interp_finalize();
    s_emit(json_pack("{s:s}", "ev", "finalized"));
    if (s_linger_ms > 0) {
        struct timespec ts = {s_linger_ms / 1000, (long) (s_linger_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0)
            ;
    }
    for (int i = 0; i < s_ninputs; i++)
        free(s_inputs[i]);
    return 0;
}
