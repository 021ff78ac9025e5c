/* ensio-launch: ``ensio run --transfer`` without Python, for job scripts (issue 28 item 2).
 *
 *   ensio-launch [run] --transfer T --component C [--socket-dir D] [--] COMMAND ...
 *
 * The same check of the same launch record as the Python hot path
 * (ensio/transfer/launch.py, which documents the format and every check): the record
 * named by the key (real path of T, C, rank, host) in D/launch/ must still hold, the
 * socket directory must be this user's with mode 0700 and the daemon must accept a
 * connection; then COMMAND is exec'ed with LD_PRELOAD, ENSIO_TRANSFER_RULES and
 * ENSIO_TRANSFER_SOCKET. Anything else execs the full path,
 * ``ENSIO_PYTHON -m ensio.cli.main run ARGS`` (the interpreter and source directory it
 * was built for), which reports errors and rewrites the record.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifndef ENSIO_PYTHON
#error "build with -DENSIO_PYTHON=\"/path/to/python\" -DENSIO_SRC=\"/path/to/src\""
#endif

#define RECORD_MAX (1 << 16)
static const char UNSET[] = "\0unset"; /* an env line's value for an unset variable */

static const char *const RANK_VARS[] = {"ENSIO_TRANSFER_RANK", "OMPI_COMM_WORLD_RANK",
                                        "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", NULL};

/* The full path: the Python ``ensio run`` with the same arguments. */
static void full_path(int argc, char **argv, int first)
{
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (args == NULL) _exit(127);
    int n = 0;
    args[n++] = ENSIO_PYTHON;
    args[n++] = "-m";
    args[n++] = "ensio.cli.main";
    args[n++] = "run";
    for (int i = first; i < argc; i++) args[n++] = argv[i];
    const char *old = getenv("PYTHONPATH");
    if (old == NULL || *old == '\0') {
        setenv("PYTHONPATH", ENSIO_SRC, 1);
    } else {
        size_t len = strlen(ENSIO_SRC) + strlen(old) + 2;
        char *joined = malloc(len);
        if (joined == NULL) _exit(127);
        snprintf(joined, len, "%s:%s", ENSIO_SRC, old);
        setenv("PYTHONPATH", joined, 1);
    }
    execv(ENSIO_PYTHON, args);
    fprintf(stderr, "ensio-launch: error: cannot execute %s: %s\n", ENSIO_PYTHON, strerror(errno));
    _exit(127);
}

static uint32_t crc32(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static uint32_t adler32(const unsigned char *p, size_t n)
{
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) { a = (a + p[i]) % 65521u; b = (b + a) % 65521u; }
    return (b << 16) | a;
}

/* os.path.realpath without strict: the deepest existing ancestor resolved, the rest
 * appended (the paths here are absolute and normalized: no "." or ".." to fold). */
static int py_realpath(const char *path, char out[PATH_MAX])
{
    char buf[PATH_MAX];
    if (strlen(path) >= sizeof buf) return -1;
    strcpy(buf, path);
    size_t cut = strlen(buf);
    for (;;) {
        char saved = buf[cut];
        buf[cut] = '\0';
        char real[PATH_MAX];
        if (realpath(cut ? buf : "/", real) != NULL) {
            buf[cut] = saved;
            const char *rest = path + cut;
            if (strcmp(real, "/") == 0 && *rest == '/') real[0] = '\0';
            size_t lr = strlen(real), lt = strlen(rest);
            if (lr + lt >= PATH_MAX) return -1;
            memcpy(out, real, lr);
            memcpy(out + lr, rest, lt + 1);
            if (out[0] == '\0') strcpy(out, "/");
            return 0;
        }
        if (errno != ENOENT && errno != ENOTDIR) return -1;
        buf[cut] = saved;
        char *slash = NULL;
        for (size_t i = cut; i-- > 0;) if (buf[i] == '/') { slash = buf + i; break; }
        if (slash == NULL) return -1;
        cut = (size_t)(slash - buf);
    }
}

/* Split one record line into tab-separated fields (in place); the number of fields. */
static int fields_of(char *line, size_t len, char *f[5], size_t flen[5])
{
    int n = 0;
    char *start = line;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || line[i] == '\t') {
            if (n == 5) return 6;
            f[n] = start;
            flen[n] = (size_t)(line + i - start);
            n++;
            if (i < len) line[i] = '\0';
            start = line + i + 1;
        }
    }
    return n;
}

static int stat_holds(char *f[5])
{
    struct stat st;
    if (stat(f[1], &st) != 0) return 0;
    char now[96];
    snprintf(now, sizeof now, "%lld\t%lld\t%llu",
             (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
             (long long)st.st_size, (unsigned long long)st.st_ino);
    char rec[96];
    snprintf(rec, sizeof rec, "%s\t%s\t%s", f[2], f[3], f[4]);
    return strcmp(now, rec) == 0;
}

static int env_holds(char *f[5], size_t flen[5])
{
    const char *now = getenv(f[1]);
    if (now == NULL) return flen[2] == sizeof UNSET - 1 && memcmp(f[2], UNSET, flen[2]) == 0;
    return strlen(now) == flen[2] && memcmp(now, f[2], flen[2]) == 0;
}

static int daemon_answers(const char *sock)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof addr.sun_path) return 0;
    strcpy(addr.sun_path, sock);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return 0;
    int ok = connect(s, (struct sockaddr *)&addr, sizeof addr) == 0;
    close(s);
    return ok;
}

/* LD_PRELOAD: lib first, earlier ensio interposers dropped, the rest kept in order. */
static char *preload(const char *lib)
{
    const char *prev = getenv("LD_PRELOAD");
    size_t len = strlen(lib) + (prev ? strlen(prev) : 0) + 2;
    char *out = malloc(len), *copy = strdup(prev ? prev : "");
    if (out == NULL || copy == NULL) return NULL;
    strcpy(out, lib);
    char *save = NULL;
    for (char *tok = strtok_r(copy, ": ", &save); tok; tok = strtok_r(NULL, ": ", &save)) {
        if (strstr(tok, "ensio_interpose") != NULL) continue;
        strcat(out, " ");
        strcat(out, tok);
    }
    free(copy);
    return out;
}

static char record[RECORD_MAX + 1];

/* Check the record of (config, component) and set COMMAND's variables; 0 if it holds. */
static int recorded_env(const char *config, const char *component, const char *sock_dir)
{
    char real[PATH_MAX], key[2 * PATH_MAX];
    if (realpath(config, real) == NULL) return -1; /* the full path reports it */
    const char *rank = "0";
    for (int i = 0; RANK_VARS[i]; i++) {
        const char *v = getenv(RANK_VARS[i]);
        if (v && *v && strspn(v, "0123456789") == strlen(v)) { rank = v; break; }
    }
    char host[256];
    const char *h = getenv("ENSIO_TRANSFER_HOST");
    if (h && *h) {
        snprintf(host, sizeof host, "%s", h);
    } else {
        struct utsname u;
        if (uname(&u) != 0) return -1;
        snprintf(host, sizeof host, "%s", u.nodename);
        char *dot = strchr(host, '.');
        if (dot) *dot = '\0';
    }
    char rank_text[32];
    snprintf(rank_text, sizeof rank_text, "%lld", atoll(rank)); /* "007" is rank 7 */
    int klen = snprintf(key, sizeof key, "%s%c%s%c%s%c%s", real, 0, component, 0, rank_text, 0,
                        host);
    if (klen < 0 || (size_t)klen >= sizeof key) return -1;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/launch/%08x%08x.rec", sock_dir,
             crc32((unsigned char *)key, (size_t)klen), adler32((unsigned char *)key, (size_t)klen));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, record, RECORD_MAX + 1);
    close(fd);
    if (n <= 0 || n > RECORD_MAX) return -1;
    record[n] = '\0';
    static const char magic[] = "ensio-launch\t1\nkey\t";
    if ((size_t)n < sizeof magic - 1 + (size_t)klen + 1 ||
        memcmp(record, magic, sizeof magic - 1) != 0 ||
        memcmp(record + sizeof magic - 1, key, (size_t)klen) != 0 ||
        record[sizeof magic - 1 + (size_t)klen] != '\n')
        return -1;
    if (n < 5 || memcmp(record + n - 5, "\nend\n", 5) != 0) return -1;
    char *lib = NULL, *sock = NULL, *sock_ino = NULL, *sock_mtime = NULL;
    char *set_name[32], *set_value[32];
    int nset = 0;
    char *line = record + sizeof magic - 1 + klen + 1, *stop = record + n - 4;
    while (line < stop) {
        char *nl = memchr(line, '\n', (size_t)(stop - line));
        if (nl == NULL) return -1;
        char *f[5];
        size_t flen[5];
        int nf = fields_of(line, (size_t)(nl - line), f, flen);
        *nl = '\0';
        if (nf == 3 && strcmp(f[0], "set") == 0) {
            if (strcmp(f[1], "LIB") == 0) {
                lib = f[2];
            } else {
                if (nset == 32) return -1;
                set_name[nset] = f[1];
                set_value[nset++] = f[2];
                if (strcmp(f[1], "ENSIO_TRANSFER_SOCKET") == 0) sock = f[2];
            }
        } else if (nf == 3 && strcmp(f[0], "socket") == 0) {
            sock_ino = f[1];
            sock_mtime = f[2];
        } else if (nf == 5 && strcmp(f[0], "stat") == 0) {
            if (!stat_holds(f)) return -1;
        } else if (nf == 3 && strcmp(f[0], "link") == 0) {
            char now[PATH_MAX];
            if (py_realpath(f[1], now) != 0 || strcmp(now, f[2]) != 0) return -1;
        } else if (nf == 3 && strcmp(f[0], "env") == 0) {
            if (!env_holds(f, flen)) return -1;
        } else {
            return -1;
        }
        line = nl + 1;
    }
    if (!lib || !sock || !sock_ino) return -1;
    struct stat st;
    if (lstat(sock_dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 077))
        return -1;
    if (stat(sock, &st) != 0) return -1;
    char ino[32], mtime[32];
    snprintf(ino, sizeof ino, "%llu", (unsigned long long)st.st_ino);
    snprintf(mtime, sizeof mtime, "%lld",
             (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
    if (strcmp(ino, sock_ino) != 0 || strcmp(mtime, sock_mtime) != 0 || !daemon_answers(sock))
        return -1;
    char *pre = preload(lib);
    if (pre == NULL) return -1;
    setenv("LD_PRELOAD", pre, 1);
    for (int k = 0; k < nset; k++) setenv(set_name[k], set_value[k], 1);
    return 0;
}

int main(int argc, char **argv)
{
    int first = (argc > 1 && strcmp(argv[1], "run") == 0) ? 2 : 1;
    const char *config = NULL, *component = NULL, *sock_dir = NULL;
    int i = first;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) { i++; break; }
        if (a[0] != '-') break;
        const char **slot = NULL;
        const char *value = NULL;
        static const char *const names[] = {"--transfer", "--component", "--socket-dir"};
        for (int k = 0; k < 3; k++) {
            size_t l = strlen(names[k]);
            if (strncmp(a, names[k], l) == 0 && (a[l] == '\0' || a[l] == '=')) {
                slot = k == 0 ? &config : k == 1 ? &component : &sock_dir;
                value = a[l] == '=' ? a + l + 1 : NULL;
            }
        }
        if (slot == NULL || *slot != NULL) full_path(argc, argv, first);
        if (value == NULL) {
            if (++i >= argc) full_path(argc, argv, first);
            value = argv[i];
        }
        *slot = value;
    }
    if (config == NULL || component == NULL || i >= argc) full_path(argc, argv, first);
    char dir[PATH_MAX];
    if (sock_dir) {
        snprintf(dir, sizeof dir, "%s", sock_dir);
    } else if (getenv("ENSIO_TRANSFER_DIR") && *getenv("ENSIO_TRANSFER_DIR")) {
        snprintf(dir, sizeof dir, "%s", getenv("ENSIO_TRANSFER_DIR"));
    } else {
        const char *rt = getenv("XDG_RUNTIME_DIR");
        struct stat st;
        if (rt && *rt && stat(rt, &st) == 0 && S_ISDIR(st.st_mode))
            snprintf(dir, sizeof dir, "%s/ensio-transfer", rt);
        else
            snprintf(dir, sizeof dir, "/tmp/ensio-transfer-%u", (unsigned)getuid());
    }
    if (recorded_env(config, component, dir) != 0) full_path(argc, argv, first);
    execvp(argv[i], argv + i);
    full_path(argc, argv, first); /* cannot execute: the full path says why */
    return 127;
}
