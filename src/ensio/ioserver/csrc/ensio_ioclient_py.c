/* ensio_ioclient_py.c -- the embedded-Python half of the C client (libensio_ioclient_py.so).
 *
 * Attached and sync modes run the Python post-processing graph and CF writer on the
 * model ranks, so the C library starts the interpreter of the ensio installation inside
 * the model process and drives ensio.ioserver.embed.Session (the Python Client on the
 * model's communicator): exactly the Python API's semantics and files.  This library is
 * the only one linked with libpython; libensio_ioclient.so dlopen()s it (RTLD_GLOBAL, so
 * the extension modules numpy, mpi4py, netCDF4 find the interpreter's symbols) only when
 * a run has no server ranks, or for read_restart; a server-mode model never loads Python.
 *
 * The interpreter is the one `ensio ioclient build` ran under (ENSIO_IOCLIENT_PYTHON at
 * build time; the environment variable ENSIO_IOCLIENT_PYTHON overrides it at run time):
 * its venv gives sys.path.  No signal handlers are installed (MPI keeps its own), the
 * GIL is taken for each call and released when it returns to the model (Python threads,
 * if any, run while the model computes), and the interpreter lives until the process
 * ends (mpi4py finds MPI initialised by the model and neither initialises nor
 * finalises it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ENSIO_IOCLIENT_PYTHON
#define ENSIO_IOCLIENT_PYTHON "python3"
#endif

static PyObject *session;  /* ensio.ioserver.embed.Session, or NULL */
static PyObject *module;   /* ensio.ioserver.embed */

/* The pending Python exception as one line into err ("Type: message", or the message
 * alone for ensio's own errors, which already name rank and field). */
static int py_error(char *err, size_t nerr) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const char *name = type ? ((PyTypeObject *)type)->tp_name : "error";
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
    if (!msg) msg = "(no message)";
    int own = strcmp(name, "IOServerError") == 0 || strcmp(name, "ConfigError") == 0 ||
              strcmp(name, "InputError") == 0 || strcmp(name, "RestartError") == 0;
    if (own) snprintf(err, nerr, "%s", msg);
    else snprintf(err, nerr, "%s: %s", name, msg);
    for (char *p = err; *p; p++)
        if (*p == '\n') *p = ' ';
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return 1;
}

/* Start the interpreter (once) and import the module; the caller holds the GIL after. */
static int start_python(char *err, size_t nerr, PyGILState_STATE *gil) {
    if (Py_IsInitialized()) {
        *gil = PyGILState_Ensure();
    } else {
        const char *python = getenv("ENSIO_IOCLIENT_PYTHON");
        if (!python || !*python) python = ENSIO_IOCLIENT_PYTHON;
        PyConfig config;
        PyConfig_InitPythonConfig(&config);
        config.install_signal_handlers = 0;
        config.parse_argv = 0;
        PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, python);
        if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
        PyConfig_Clear(&config);
        if (PyStatus_Exception(st)) {
            snprintf(err, nerr, "cannot start the Python of ensio (%s): %s", python,
                     st.err_msg ? st.err_msg : "?");
            return 1;
        }
        PyEval_SaveThread();               /* the model's thread runs without the GIL */
        *gil = PyGILState_Ensure();
    }
    if (module) return 0;
    module = PyImport_ImportModule("ensio.ioserver.embed");
    if (!module) {
        char why[768];
        py_error(why, sizeof why);
        snprintf(err, nerr, "cannot import ensio.ioserver.embed in the embedded Python "
                 "(set ENSIO_IOCLIENT_PYTHON to the python of the ensio installation): %s", why);
        PyGILState_Release(*gil);
        return 1;
    }
    return 0;
}

/* Convert a Python result into out[0..nout) (None: nothing; a number; a tuple). */
static int to_doubles(PyObject *res, double *out, int nout) {
    if (!out || nout < 1 || res == Py_None) return 0;
    if (PyTuple_Check(res)) {
        Py_ssize_t n = PyTuple_Size(res);
        for (Py_ssize_t i = 0; i < n && i < nout; i++)
            out[i] = PyFloat_AsDouble(PyTuple_GetItem(res, i));
    } else {
        out[0] = PyFloat_AsDouble(res);
    }
    return PyErr_Occurred() ? 1 : 0;
}

/* Create the session: Session(comm_f, config, context); 0 or 1 with err. */
int ensio_ioclient_py_start(int comm_f, const char *config, const char *context, char *err,
                            size_t nerr) {
    PyGILState_STATE gil;
    int rc = 0;
    if (start_python(err, nerr, &gil)) return 1;
    if (session) {
        snprintf(err, nerr, "the embedded client is already started");
        rc = 1;
    } else {
        session = PyObject_CallMethod(module, "Session", "iss", comm_f, config, context);
        if (!session) rc = py_error(err, nerr);
    }
    PyGILState_Release(gil);
    return rc;
}

static int call(PyObject *target, const char *method, double *out, int nout, char *err,
                size_t nerr, const char *fmt, va_list ap) {
    PyObject *args = Py_VaBuildValue(fmt, ap);
    if (!args) return py_error(err, nerr);
    if (!PyTuple_Check(args)) {
        PyObject *t = PyTuple_Pack(1, args);
        Py_DECREF(args);
        args = t;
    }
    PyObject *fn = PyObject_GetAttrString(target, method);
    PyObject *res = fn ? PyObject_CallObject(fn, args) : NULL;
    Py_XDECREF(fn);
    Py_DECREF(args);
    if (!res) return py_error(err, nerr);
    int rc = to_doubles(res, out, nout);
    Py_DECREF(res);
    if (rc) return py_error(err, nerr);
    return 0;
}

/* Call session.method(*Py_BuildValue(fmt, ...)) (on_module: ensio.ioserver.embed.method);
 * its number(s) into out.  0 on success, 1 with err on a Python exception. */
int ensio_ioclient_py_call(int on_module, const char *method, double *out, int nout,
                           char *err, size_t nerr, const char *fmt, ...) {
    PyGILState_STATE gil;
    int rc = 1;
    if (start_python(err, nerr, &gil)) return 1;
    PyObject *target = on_module ? module : session;
    if (target) {
        va_list ap;
        va_start(ap, fmt);
        rc = call(target, method, out, nout, err, nerr, fmt, ap);
        va_end(ap);
    } else {
        snprintf(err, nerr, "%s: the embedded client is not started", method);
    }
    PyGILState_Release(gil);
    return rc;
}

/* Forget the session (after finalize); the interpreter stays for a later init. */
void ensio_ioclient_py_end(void) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_CLEAR(session);
    PyGILState_Release(gil);
}
