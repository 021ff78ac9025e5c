/* ensio transfer interposer: the rules file, path canonicalization, glob matching.
 *
 * Rules file (written by `ensio run`, ensio/transfer/run.py):
 *   ensio-transfer-rules 1
 *   component <name>
 *   rule <P|C|B> <budget bytes|-1> <files|error> <persist 0|1> <timeout ms> <conn> <pattern>
 *   route <conn> <S|A> <host,host,...|->
 *   partial <conn>
 * The pattern runs to the end of its line (it may contain spaces). A route line (after
 * the rules) gives the rules of <conn> their mode (sync/async) and the hosts that
 * receive this process's files (streamed by the daemon; "-": none). A partial line
 * (serve_partial) lets a consumer read a file of <conn> still arriving from another host.
 *
 * The cost for a path no rule can match is one pass over its last component
 * (no system call): the full canonicalization (getcwd or the directory descriptor's
 * name, then "." / ".." / "//" removed lexically) happens only when the last
 * component already matches some rule's last component.
 */
#include "ensio_interpose.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ei_rule rules[EI_MAX_RULES];
static int nrules;

int ei_glob_match(const char *p, const char *s)
{
    for (;; p++, s++) {
        switch (*p) {
        case '\0':
            return *s == '\0';
        case EI_STAR:
            for (const char *t = s;; t++) {
                if (ei_glob_match(p + 1, t)) return 1;
                if (*t == '\0' || *t == '/') return 0;
            }
        case EI_DIGITS:
            if (*s < '0' || *s > '9') return 0;
            while (s[1] >= '0' && s[1] <= '9') {
                if (ei_glob_match(p + 1, s + 1)) return 1;
                s++;
            }
            break;
        case EI_DIGIT:
            if (*s < '0' || *s > '9') return 0;
            break;
        default:
            if (*p != *s) return 0;
        }
    }
}

/* The last component of a slash-terminated-or-not string (pattern or path). */
static const char *last_component(const char *s)
{
    const char *slash = strrchr(s, '/');
    return slash ? slash + 1 : s;
}

static int parse_rule(char *line, struct ei_rule *r)
{
    char role;
    int used = 0;
    if (sscanf(line, "rule %c %lld %7s %d %ld %159s %n", &role, &r->budget, r->fallback,
               &r->persist, &r->timeout_ms, r->conn, &used) != 6 || used == 0)
        return -1;
    r->role = role == 'P' ? EI_PRODUCER : role == 'C' ? EI_CONSUMER
            : role == 'B' ? EI_PRODUCER | EI_CONSUMER : 0;
    r->pattern = strdup(line + used);
    if (r->role == 0 || r->pattern == NULL || r->pattern[0] != '/') return -1;
    r->prefix_len = strcspn(r->pattern, "\x01\x02\x03");
    r->last = last_component(r->pattern);
    return 0;
}

static int parse_route(const char *line)
{
    char conn[160], mode, targets[256];
    if (sscanf(line, "route %159s %c %255s", conn, &mode, targets) != 3) return -1;
    for (int i = 0; i < nrules; i++) {
        if (strcmp(rules[i].conn, conn) != 0) continue;
        rules[i].async = mode == 'A';
        snprintf(rules[i].targets, sizeof rules[i].targets, "%s",
                 strcmp(targets, "-") == 0 ? "" : targets);
    }
    return 0;
}

static int parse_partial(const char *line)
{
    char conn[160];
    if (sscanf(line, "partial %159s", conn) != 1) return -1;
    for (int i = 0; i < nrules; i++)
        if (strcmp(rules[i].conn, conn) == 0) rules[i].partial = 1;
    return 0;
}

/* Read the rules once at start-up (real open/read: the wrappers are not ready yet). */
int ei_load_rules(const char *file)
{
    int fd = ei_real.open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    static char text[1 << 16];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len)) > 0)
        len += (size_t)n;
    ei_real.close(fd);
    text[len] = '\0';
    if (strncmp(text, "ensio-transfer-rules 1\n", 23) != 0) return -1;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (strncmp(line, "component ", 10) == 0) {
            snprintf(ei_component, sizeof ei_component, "%s", line + 10);
        } else if (strncmp(line, "rule ", 5) == 0 && nrules < EI_MAX_RULES) {
            if (parse_rule(line, &rules[nrules]) == 0) nrules++;
            else return -1;
        } else if (strncmp(line, "route ", 6) == 0 && parse_route(line) != 0) {
            return -1;
        } else if (strncmp(line, "partial ", 8) == 0 && parse_partial(line) != 0) {
            return -1;
        }
    }
    return nrules > 0 ? 0 : -1;
}

/* Remove "//", "/./" and resolve "/../" lexically, in place (absolute path). */
static void normalize(char *p)
{
    char *out = p;
    const char *in = p;
    while (*in) {
        while (*in == '/') in++;
        const char *end = strchrnul(in, '/');
        size_t n = (size_t)(end - in);
        if (n == 0) break;
        if (n == 1 && in[0] == '.') {
            /* skip */
        } else if (n == 2 && in[0] == '.' && in[1] == '.') {
            while (out > p && *--out != '/') {}
        } else {
            *out++ = '/';
            memmove(out, in, n);
            out += n;
        }
        in = end;
    }
    if (out == p) *out++ = '/';
    *out = '\0';
}

/* The absolute, normalized form of (dirfd, path) in out; -1 if it does not fit. */
int ei_canonical(int dirfd, const char *path, char out[PATH_MAX])
{
    size_t len;
    if (path[0] == '/') {
        len = 0;
    } else if (dirfd == AT_FDCWD) {
        if (getcwd(out, PATH_MAX) == NULL) return -1;
        len = strlen(out);
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, out, PATH_MAX - 1);
        if (n <= 0 || out[0] != '/') return -1;
        len = (size_t)n;
    }
    size_t plen = strlen(path);
    if (len + 1 + plen >= PATH_MAX) return -1;
    if (len) out[len++] = '/';
    memcpy(out + len, path, plen + 1);
    normalize(out);
    return 0;
}

const struct ei_rule *ei_classify(int dirfd, const char *path, char out[PATH_MAX], int want)
{
    if (!ei_active || path == NULL || path[0] == '\0' || strchr(path, '\n')) return NULL;
    const char *base = last_component(path);
    int maybe = base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0;
    for (int i = 0; i < nrules && !maybe; i++)
        maybe = ei_glob_match(rules[i].last, base);
    if (!maybe || ei_canonical(dirfd, path, out) != 0) return NULL;
    const struct ei_rule *first = NULL;
    for (int i = 0; i < nrules; i++)
        if (strncmp(out, rules[i].pattern, rules[i].prefix_len) == 0
            && ei_glob_match(rules[i].pattern, out)) {
            if (rules[i].role & want) return &rules[i];
            if (first == NULL) first = &rules[i];
        }
    return first;
}

/* Can the absolute, normalized directory dir hold files of some rule (its pattern's
 * directory part matches dir)? The directory view (ensio_interpose_dirs.c) asks the
 * daemon only for such directories. */
int ei_dir_may_hold(const char *dir)
{
    if (!ei_active) return 0;
    char pdir[PATH_MAX];
    for (int i = 0; i < nrules; i++) {
        size_t n = (size_t)(rules[i].last - rules[i].pattern);  /* with the last '/' */
        if (n == 0 || n >= sizeof pdir) continue;
        memcpy(pdir, rules[i].pattern, n - 1);
        pdir[n - 1] = '\0';
        if (n == 1) { pdir[0] = '/'; pdir[1] = '\0'; }
        if (ei_glob_match(pdir, dir)) return 1;
    }
    return 0;
}

/* Append conn to the comma-separated list out (room bytes) unless it is there. */
static void add_conn(char *out, size_t room, const char *conn)
{
    size_t len = strlen(conn), used = strlen(out);
    for (const char *p = out; *p;) {
        const char *end = strchrnul(p, ',');
        if ((size_t)(end - p) == len && strncmp(p, conn, len) == 0) return;
        p = *end ? end + 1 : end;
    }
    if (used + len + 2 < room)
        snprintf(out + used, room - used, "%s%s", used ? "," : "", conn);
}

/* Every program started under the interposer (each exec) tells the daemon which
 * connections it produces and consumes; its connection's end is its end
 * (ensio/transfer/view.py, Runs: a connection's producer is live while any of its
 * programs runs, so the first process of a run, a shell running several programs, covers
 * the gaps between them). Nothing is written to the environment: bash, for one, keeps
 * its own and answers getenv from it once a variable is set. Called once at start-up,
 * after the rules are loaded. */
void ei_announce_run(void)
{
    static char produces[4096], consumes[4096];
    for (int i = 0; i < nrules; i++) {
        if (rules[i].role & EI_PRODUCER) add_conn(produces, sizeof produces, rules[i].conn);
        if (rules[i].role & EI_CONSUMER) add_conn(consumes, sizeof consumes, rules[i].conn);
    }
    char msg[8192 + 256], reply[EI_REPLY_MAX];
    int n = snprintf(msg, sizeof msg, "RUN\ncomponent=%s\nproduces=%s\nconsumes=%s", ei_component,
                     produces, consumes);
    if (n <= 0 || (size_t)n >= sizeof msg) return;
    pthread_mutex_lock(&ei_lock);
    if (ei_daemon_usable()) ei_request(msg, (size_t)n, -1, reply, NULL);
    pthread_mutex_unlock(&ei_lock);
}

/* Does this process only consume canon (absolute, normalized)? Some rule matching it
 * consumes, none produces: a component that also produces the name (ensio analyse
 * rewriting forecasts as analyses, its undo journal beside them) must not wait for it. */
int ei_only_consumes(const char *canon)
{
    int consumes = 0;
    for (int i = 0; i < nrules; i++)
        if (strncmp(canon, rules[i].pattern, rules[i].prefix_len) == 0
            && ei_glob_match(rules[i].pattern, canon)) {
            if (rules[i].role & EI_PRODUCER) return 0;
            consumes = 1;
        }
    return consumes;
}
