/* ensio transfer interposer: glob, scandir and wordexp on the held names.
 *
 * glibc's glob(), scandir() and wordexp() read directories through internal calls that
 * no LD_PRELOAD library sees, so they would never list a held file: glob is called
 * with GLOB_ALTDIRFUNC and the interposed opendir/readdir (ensio_interpose_dirs.c),
 * scandir is rebuilt on them, and wordexp's words that still hold a wildcard (glibc
 * leaves a pattern that matched nothing as it is) are globbed again here. CDO expands
 * its file-name wildcards with glob and wordexp.
 */
#include "ensio_interpose.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <wordexp.h>

#define EXPORT __attribute__((visibility("default")))
#define REAL(type, name) \
    static __typeof__(type) real_##name; \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

static void *alt_opendir(const char *path) { return opendir(path); }
static void alt_closedir(void *d) { closedir(d); }
static struct dirent *alt_readdir(void *d) { return readdir(d); }
static struct dirent64 *alt_readdir64(void *d) { return readdir64(d); }

EXPORT int glob(const char *pattern, int flags, int (*errfunc)(const char *, int),
                glob_t *g)
{
    REAL(int (*)(const char *, int, int (*)(const char *, int), glob_t *), glob);
    ei_init();
    if (!ei_active || (flags & GLOB_ALTDIRFUNC))
        return real_glob(pattern, flags, errfunc, g);
    g->gl_opendir = alt_opendir;
    g->gl_readdir = alt_readdir;
    g->gl_closedir = alt_closedir;
    g->gl_stat = stat;
    g->gl_lstat = lstat;
    return real_glob(pattern, flags | GLOB_ALTDIRFUNC, errfunc, g);
}

EXPORT int glob64(const char *pattern, int flags, int (*errfunc)(const char *, int),
                  glob64_t *g)
{
    REAL(int (*)(const char *, int, int (*)(const char *, int), glob64_t *), glob64);
    ei_init();
    if (!ei_active || (flags & GLOB_ALTDIRFUNC))
        return real_glob64(pattern, flags, errfunc, g);
    g->gl_opendir = alt_opendir;
    g->gl_readdir = alt_readdir64;
    g->gl_closedir = alt_closedir;
    g->gl_stat = stat64;
    g->gl_lstat = lstat64;
    return real_glob64(pattern, flags | GLOB_ALTDIRFUNC, errfunc, g);
}

/* scandir on the interposed stream (glibc's reads its directory internally). */
static int scan(const char *path, struct dirent64 ***out,
                int (*sel)(const struct dirent64 *),
                int (*cmp)(const struct dirent64 **, const struct dirent64 **))
{
    DIR *d = opendir(path);
    if (d == NULL) return -1;
    struct dirent64 **list = NULL, *e;
    size_t n = 0, room = 0;
    int err = 0;
    errno = 0;
    while ((e = readdir64(d)) != NULL) {
        if (sel && !sel(e)) continue;
        if (n == room) {
            room = room ? 2 * room : 32;
            struct dirent64 **grown = realloc(list, room * sizeof *list);
            if (grown == NULL) { err = ENOMEM; break; }
            list = grown;
        }
        struct dirent64 *copy = malloc(e->d_reclen > sizeof *e ? e->d_reclen : sizeof *e);
        if (copy == NULL) { err = ENOMEM; break; }
        memcpy(copy, e, e->d_reclen < sizeof *e ? e->d_reclen : sizeof *e);
        list[n++] = copy;
        errno = 0;
    }
    if (err == 0 && errno != 0) err = errno;
    closedir(d);
    if (err) {
        while (n) free(list[--n]);
        free(list);
        errno = err;
        return -1;
    }
    if (cmp && n > 1)
        qsort(list, n, sizeof *list, (int (*)(const void *, const void *))cmp);
    *out = list;
    return (int)n;
}

/* Does any rule hold files in path's directory itself? (scandir's own directory) */
static int dir_of_interest(const char *path)
{
    ei_init();
    char canon[PATH_MAX];
    return ei_active && ei_canonical(AT_FDCWD, path, canon) == 0 && ei_dir_may_hold(canon);
}

EXPORT int scandir64(const char *path, struct dirent64 ***out,
                     int (*sel)(const struct dirent64 *),
                     int (*cmp)(const struct dirent64 **, const struct dirent64 **))
{
    REAL(int (*)(const char *, struct dirent64 ***, int (*)(const struct dirent64 *),
                 int (*)(const struct dirent64 **, const struct dirent64 **)), scandir64);
    if (!dir_of_interest(path)) return real_scandir64(path, out, sel, cmp);
    return scan(path, out, sel, cmp);
}

EXPORT int scandir(const char *path, struct dirent ***out, int (*sel)(const struct dirent *),
                   int (*cmp)(const struct dirent **, const struct dirent **))
{
    REAL(int (*)(const char *, struct dirent ***, int (*)(const struct dirent *),
                 int (*)(const struct dirent **, const struct dirent **)), scandir);
    if (!dir_of_interest(path)) return real_scandir(path, out, sel, cmp);
    return scan(path, (struct dirent64 ***)out, (int (*)(const struct dirent64 *))sel,
                (int (*)(const struct dirent64 **, const struct dirent64 **))cmp);
}

static int has_wildcard(const char *s)
{
    return strpbrk(s, "*?[") != NULL;
}

/* glibc's wordexp globs each field with GLOB_NOCHECK through internal calls: a field
 * that still holds a wildcard matched nothing on disk. Such fields are globbed again
 * here (held names included); what matches replaces the field, sorted as glob sorts. */
EXPORT int wordexp(const char *words, wordexp_t *we, int flags)
{
    REAL(int (*)(const char *, wordexp_t *, int), wordexp);
    int rc = real_wordexp(words, we, flags);
    ei_init();
    if (rc != 0 || !ei_active) return rc;
    size_t first = (flags & WRDE_DOOFFS) ? we->we_offs : 0;
    for (size_t i = first; i < first + we->we_wordc; i++) {
        char *w = we->we_wordv[i];
        if (w == NULL || !has_wildcard(w)) continue;
        glob_t g;
        memset(&g, 0, sizeof g);
        if (glob(w, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
            globfree(&g);
            continue;
        }
        size_t total = first + we->we_wordc + g.gl_pathc;  /* -1 + the NULL */
        char **grown = realloc(we->we_wordv, total * sizeof *grown);
        char **copies = calloc(g.gl_pathc, sizeof *copies);
        int ok = grown != NULL && copies != NULL;
        if (grown) we->we_wordv = grown;
        for (size_t k = 0; ok && k < g.gl_pathc; k++)
            ok = (copies[k] = strdup(g.gl_pathv[k])) != NULL;
        if (!ok) {
            for (size_t k = 0; copies && k < g.gl_pathc; k++) free(copies[k]);
            free(copies);
            globfree(&g);
            return WRDE_NOSPACE;
        }
        char **v = we->we_wordv;
        memmove(v + i + g.gl_pathc, v + i + 1,
                (first + we->we_wordc - i - 1 + 1) * sizeof *v);  /* the rest and the NULL */
        free(w);
        memcpy(v + i, copies, g.gl_pathc * sizeof *v);
        we->we_wordc += g.gl_pathc - 1;
        i += g.gl_pathc - 1;
        free(copies);
        globfree(&g);
    }
    return rc;
}
