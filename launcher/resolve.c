/*
 * resolve.c: launch_resolve (cli.h), the worker command from the
 * entrypoint: which program runs (a Python for a script, a module or
 * --run_path: PYTHON_EXEC, the python3 of the environment cddprun is
 * installed in, or python3 on PATH; the entrypoint itself otherwise),
 * found as execvp would, checked to exist and be executable before
 * anything starts, and its argv.
 */
#include "launcher/cli.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/flags.h"
#include "common/strutil.h"

static bool is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* execvp's search: a name with a slash is a path; otherwise each PATH entry. */
static char *find_program(const char *name, char **envp)
{
    if (strchr(name, '/'))
        return is_exec_file(name) ? strdup(name) : NULL;
    const char *path = cddp_flags_getenv(envp, "PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        struct cddp_buf b;
        cddp_buf_init(&b, 8192);
        if (cddp_buf_printf(&b, "%.*s%s%s", (int)dl, p, dl ? "/" : "", name) == 0 &&
            is_exec_file(b.data))
            return b.data;
        cddp_buf_free(&b);
        if (colon == NULL)
            return NULL;
        p = colon + 1;
    }
}

char *launch_python_beside(const char *exe)
{
    const char *slash = strrchr(exe, '/');
    if (slash == NULL || slash == exe)
        return NULL;
    size_t bin_len = (size_t)(slash - exe);
    /* The environment's root: the parent of the directory cddprun is in. */
    const char *up = exe + bin_len;
    while (up > exe && up[-1] != '/')
        up--;
    size_t root_len = up > exe ? (size_t)(up - exe - 1) : 0;
    struct cddp_buf b;
    cddp_buf_init(&b, 8192);
    struct stat st;
    bool env = false;
    if (cddp_buf_printf(&b, "%.*s/pyvenv.cfg", (int)root_len, exe) == 0)
        env = stat(b.data, &st) == 0 && S_ISREG(st.st_mode);
    cddp_buf_reset(&b);
    if (!env && cddp_buf_printf(&b, "%.*s/conda-meta", (int)root_len, exe) == 0)
        env = stat(b.data, &st) == 0 && S_ISDIR(st.st_mode);
    cddp_buf_reset(&b);
    if (env && cddp_buf_printf(&b, "%.*s/python3", (int)bin_len, exe) == 0 && is_exec_file(b.data))
        return b.data;
    cddp_buf_free(&b);
    return NULL;
}

char *launch_auto_progress_dir(const char *exe)
{
    static const char *const beside[] = {"../share/cddp/autoprogress", "../lib/cddp/autoprogress",
                                         "../python/autoprogress"};
    const char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(beside) / sizeof(beside[0]); i++) {
        struct cddp_buf b;
        cddp_buf_init(&b, 8192);
        if (cddp_buf_printf(&b, "%.*s/%s/sitecustomize.py", (int)(slash - exe), exe, beside[i]) ==
                0 &&
            access(b.data, R_OK) == 0) {
            /* The folder, as an absolute path without "..": Python compares
             * PYTHONPATH entries with its own __file__'s folder. */
            b.data[b.len - strlen("/sitecustomize.py")] = '\0';
            char *real = realpath(b.data, NULL);
            cddp_buf_free(&b);
            return real;
        }
        cddp_buf_free(&b);
    }
    return NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* --run_path: runpy.run_path(script) as __main__, recording an uncaught
 * exception in TORCHELASTIC_ERROR_FILE in torch's error.json format, as
 * torchrun's multiprocessing wrapper (@record) does. The worker then ends
 * as torchrun's multiprocessing child does (multiprocessing/process.py
 * _bootstrap, then os._exit in popen_fork and forkserver): the exit code
 * from SystemExit (None 0, an int itself, anything else printed to stderr
 * and 1) or 1 after an exception's traceback; non-daemon threads joined
 * (threading._shutdown), atexit handlers run, stdout and stderr flushed,
 * and then os._exit. A normal interpreter shutdown would go on to run
 * C++ static destructors, where torch's threads sometimes abort
 * ("terminate called without an active exception") after the script is
 * done. KeyboardInterrupt ends the worker by SIGINT, as python3 itself
 * does (torch's spawn wrapper would call it a success). */
static const char run_path_bootstrap[] =
    "import atexit, json, os, runpy, signal, sys, threading, time, traceback\n"
    "sys.argv = sys.argv[1:]\n"
    "code = 0\n"
    "sigint = False\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    if e.code is None:\n"
    "        code = 0\n"
    "    elif isinstance(e.code, int):\n"
    "        code = e.code\n"
    "    else:\n"
    "        sys.stderr.write(str(e.code) + '\\n')\n"
    "        code = 1\n"
    "except KeyboardInterrupt:\n"
    "    sigint = True\n"
    "except BaseException as e:\n"
    "    code = 1\n"
    "    traceback.print_exc()\n"
    "    f = os.environ.get('TORCHELASTIC_ERROR_FILE')\n"
    "    if f:\n"
    "        with open(f, 'w') as fp:\n"
    "            json.dump({'message': {'message': f'{type(e).__name__}: {e}', 'extraInfo': {\n"
    "                'py_callstack': traceback.format_exc(),\n"
    "                'timestamp': str(int(time.time()))}}}, fp)\n"
    "for step in (getattr(threading, '_shutdown', lambda: None), atexit._run_exitfuncs):\n"
    "    try:\n"
    "        step()\n"
    "    except BaseException:\n"
    "        traceback.print_exc()\n"
    "for s in (sys.stdout, sys.stderr):\n"
    "    try:\n"
    "        s.flush()\n"
    "    except BaseException:\n"
    "        pass\n"
    "if sigint:\n"
    "    signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    code = 130\n"
    "os._exit(code & 0xff)\n";

int launch_resolve(struct launch_config *cfg, char **envp, char *err, size_t errlen)
{
    const char *ep = cfg->entrypoint;
    if (cfg->log_dir) {
        struct stat st;
        if (stat(cfg->log_dir, &st) == 0 && !S_ISDIR(st.st_mode) &&
            strcmp(cfg->log_dir, "/dev/null") != 0)
            return cddp_fail(err, errlen, CDDP_ECONFIG, "--log_dir=%s: is a file, not a directory",
                             cfg->log_dir);
    }

    if (cfg->run_path)
        cfg->kind = LAUNCH_RUN_PATH;
    else if (cfg->module)
        cfg->kind = LAUNCH_PYTHON_MODULE;
    else if (cfg->no_python)
        cfg->kind = LAUNCH_BINARY;
    else if (ends_with(ep, ".py"))
        cfg->kind = LAUNCH_PYTHON_SCRIPT;
    else
        cfg->kind = LAUNCH_BINARY;

    const char *python = NULL;
    if (cfg->kind != LAUNCH_BINARY) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        self[n > 0 ? n : 0] = '\0';
        if (!cfg->no_auto_progress && n > 0)
            cfg->auto_progress_dir = launch_auto_progress_dir(self);
        /* PYTHON_EXEC, else the environment's own python3 when cddprun was
         * installed into one (pip: a venv's or conda environment's bin/),
         * else python3 from PATH. */
        python = cddp_flags_getenv(envp, "PYTHON_EXEC");
        cfg->python_from = "PYTHON_EXEC";
        if (python == NULL || *python == '\0') {
            if (n > 0)
                cfg->program = launch_python_beside(self);
            /* By its path, also as argv[0]: Python finds its environment
             * (pyvenv.cfg) from argv[0], and a bare name would be looked
             * up on PATH, which may hold another python3. */
            python = cfg->program ? cfg->program : "python3";
            cfg->python_from =
                cfg->program ? "the Python environment cddprun is installed in" : "python3 on PATH";
        }
        if (cfg->program == NULL)
            cfg->program = find_program(python, envp);
        if (cfg->program == NULL)
            return cddp_fail(err, errlen, CDDP_ENOTFOUND,
                             "%s: Python interpreter not found or not executable (set PYTHON_EXEC)",
                             python);
    }
    if (cfg->kind == LAUNCH_PYTHON_SCRIPT || cfg->kind == LAUNCH_RUN_PATH) {
        struct stat st;
        if (stat(ep, &st) != 0)
            return cddp_fail(err, errlen, CDDP_ENOTFOUND, "training script '%s': %s", ep,
                             strerror(errno));
        if (!S_ISREG(st.st_mode) || access(ep, R_OK) != 0)
            return cddp_fail(err, errlen, CDDP_ECONFIG, "training script '%s': not a readable file",
                             ep);
    }
    if (cfg->kind == LAUNCH_BINARY) {
        /* As execvp and torchrun (--no_python: subprocess, i.e. execvp): a
         * name with a slash is a path, a bare name is looked up in PATH
         * only. The working directory is never searched: `cddprun sh -c ..`
         * must not run a ./sh that happens to be there (docs/cli.md). */
        struct stat st;
        if (strchr(ep, '/')) {
            if (stat(ep, &st) != 0)
                return cddp_fail(err, errlen, CDDP_ENOTFOUND, "entrypoint '%s': %s", ep,
                                 strerror(errno));
            if (!S_ISREG(st.st_mode))
                return cddp_fail(err, errlen, CDDP_ECONFIG, "entrypoint '%s': not a regular file",
                                 ep);
            if (access(ep, X_OK) != 0)
                return cddp_fail(err, errlen, CDDP_ECONFIG,
                                 "entrypoint '%s': not executable (chmod +x it, or run a Python "
                                 "script named *.py)",
                                 ep);
            cfg->program = strdup(ep);
            if (cfg->program == NULL)
                return CDDP_ERR_FROM_ERRNO(ENOMEM);
        } else {
            cfg->program = find_program(ep, envp);
            if (cfg->program == NULL && stat(ep, &st) == 0)
                return cddp_fail(err, errlen, CDDP_ENOTFOUND,
                                 "entrypoint '%s': not found in PATH (a bare name is looked up in "
                                 "PATH only; for the one in the working directory write ./%s)",
                                 ep, ep);
            if (cfg->program == NULL)
                return cddp_fail(err, errlen, CDDP_ENOTFOUND,
                                 "entrypoint '%s': not found in PATH or not executable", ep);
        }
    }

    /* argv: [program-as-named, python flags..., entrypoint, args...] */
    int n = 0;
    cfg->argv = calloc((size_t)cfg->nentry_args + 8, sizeof(char *));
    if (cfg->argv == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    switch (cfg->kind) {
    case LAUNCH_BINARY:
        cfg->argv[n++] = (char *)ep;
        break;
    case LAUNCH_PYTHON_SCRIPT:
        cfg->argv[n++] = (char *)python;
        cfg->argv[n++] = (char *)"-u";
        cfg->argv[n++] = (char *)ep;
        break;
    case LAUNCH_PYTHON_MODULE:
        cfg->argv[n++] = (char *)python;
        cfg->argv[n++] = (char *)"-u";
        cfg->argv[n++] = (char *)"-m";
        cfg->argv[n++] = (char *)ep;
        break;
    case LAUNCH_RUN_PATH:
        cfg->argv[n++] = (char *)python;
        cfg->argv[n++] = (char *)"-u";
        cfg->argv[n++] = (char *)"-c";
        cfg->argv[n++] = (char *)run_path_bootstrap;
        cfg->argv[n++] = (char *)ep;
        break;
    }
    for (int i = 0; i < cfg->nentry_args; i++)
        cfg->argv[n++] = cfg->entry_args[i];
    cfg->argv[n] = NULL;
    cfg->argc = n;
    return 0;
}
