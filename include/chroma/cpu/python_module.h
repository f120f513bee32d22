// The `chroma_model` Python extension half of an artifact library (see program_main.h).
// It needs only the CPython API and the buffer protocol (NumPy arrays provide it); shape and
// dtype checks with friendly messages live in the Python package (chroma/runtime/cpu.py), this
// layer re-checks byte sizes so a mistake can never write out of bounds.
#pragma once

#include <Python.h>

// Weak references: null outside a Python process, never called there.
#pragma weak PyModuleDef_Init
#pragma weak PyCapsule_New
#pragma weak PyCapsule_GetPointer
#pragma weak PyCapsule_IsValid
#pragma weak PyErr_SetString
#pragma weak PyExc_ValueError
#pragma weak PyExc_IndexError
#pragma weak PyExc_RuntimeError
#pragma weak PyExc_TypeError
#pragma weak PyExc_ZeroDivisionError
#pragma weak PyObject_GetBuffer
#pragma weak PyBuffer_Release
#pragma weak PyTuple_Size
#pragma weak PyTuple_GetItem
#pragma weak PyList_Size
#pragma weak PyList_GetItem
#pragma weak PyUnicode_AsUTF8
#pragma weak PyUnicode_FromString
#pragma weak PyLong_FromLong
#pragma weak PyLong_AsLong
#pragma weak PyList_New
#pragma weak PyList_SetItem
#pragma weak PyFloat_FromDouble
#pragma weak PyErr_Occurred
#pragma weak PyEval_SaveThread
#pragma weak PyEval_RestoreThread
#pragma weak _Py_Dealloc
#pragma weak _Py_NoneStruct
#pragma weak PyModule_AddFunctions

#include <vector>

namespace chroma_gen_py {

inline chroma_program* handle(PyObject* cap) {
  return static_cast<chroma_program*>(PyCapsule_GetPointer(cap, "chroma_program"));
}

inline void capsule_free(PyObject* cap) { chroma_close(handle(cap)); }

inline PyObject* py_open(PyObject*, PyObject* args) {
  if (PyTuple_Size(args) != 2) {
    PyErr_SetString(PyExc_TypeError, "open(directory, threads) takes two arguments");
    return nullptr;
  }
  const char* dir = PyUnicode_AsUTF8(PyTuple_GetItem(args, 0));
  if (!dir) return nullptr;
  const long threads = PyLong_AsLong(PyTuple_GetItem(args, 1));
  if (threads == -1 && PyErr_Occurred()) return nullptr;
  std::string why;
  chroma_program* p = chroma_gen_detail::open_program(dir, static_cast<int>(threads), &why);
  if (!p) {
    PyErr_SetString(PyExc_ValueError, why.c_str());
    return nullptr;
  }
  return PyCapsule_New(p, "chroma_program", capsule_free);
}

struct Buffers {
  std::vector<Py_buffer> views;
  ~Buffers() {
    for (Py_buffer& b : views) PyBuffer_Release(&b);
  }
};

inline bool get_buffers(PyObject* list, const chroma::rt::IoSpec* specs, int n, bool writable, const char* what,
                        Buffers* out) {
  if (PyList_Size(list) != n) {
    PyErr_SetString(PyExc_ValueError, (std::string(what) + ": expected " + std::to_string(n) + " arrays").c_str());
    return false;
  }
  out->views.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Py_buffer view;
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(PyList_GetItem(list, i), &view, flags) != 0) return false;
    out->views.push_back(view);
    if (view.len != specs[i].nbytes) {
      PyErr_SetString(PyExc_ValueError, (std::string(what) + " " + std::to_string(i) + " has " + std::to_string(view.len) +
                                         " bytes, expected " + std::to_string(specs[i].nbytes)).c_str());
      return false;
    }
  }
  return true;
}

// run(program, entry, inputs, outputs[, iters]): with iters, runs that many times and
// returns the mean seconds per kernel (a list); else None.
inline PyObject* py_run(PyObject*, PyObject* args) {
  const Py_ssize_t nargs = PyTuple_Size(args);
  if (nargs != 4 && nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "run(program, entry, inputs, outputs[, iters]) takes four or five arguments");
    return nullptr;
  }
  chroma_program* p = handle(PyTuple_GetItem(args, 0));
  if (!p) return nullptr;
  const long entry = PyLong_AsLong(PyTuple_GetItem(args, 1));
  if (entry == -1 && PyErr_Occurred()) return nullptr;
  if (entry < 0 || entry >= chroma_gen::kNumEntries) {
    PyErr_SetString(PyExc_ValueError, "no such entry point");
    return nullptr;
  }
  long iters = 0;
  if (nargs == 5) {
    iters = PyLong_AsLong(PyTuple_GetItem(args, 4));
    if (iters == -1 && PyErr_Occurred()) return nullptr;
    if (iters < 1) {
      PyErr_SetString(PyExc_ValueError, "iters must be positive");
      return nullptr;
    }
  }
  const chroma::rt::EntryInfo& e = chroma_gen::kEntries[entry];
  Buffers ins, outs;
  if (!get_buffers(PyTuple_GetItem(args, 2), e.inputs, e.num_inputs, false, "input", &ins)) return nullptr;
  if (!get_buffers(PyTuple_GetItem(args, 3), e.outputs, e.num_outputs, true, "output", &outs)) return nullptr;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (Py_buffer& b : ins.views) in_ptrs.push_back(b.buf);
  for (Py_buffer& b : outs.views) out_ptrs.push_back(b.buf);
  in_ptrs.push_back(nullptr);
  out_ptrs.push_back(nullptr);
  std::string why;
  std::vector<double> seconds(static_cast<size_t>(e.num_kernels) + 1, 0.0);
  int rc = 0;
  PyThreadState* ts = PyEval_SaveThread();
  if (iters == 0) {
    rc = chroma_gen_detail::run_program(p, static_cast<int>(entry), in_ptrs.data(), out_ptrs.data(), &why);
  } else {
    for (long it = 0; it < iters && rc == 0; ++it) {
      rc = chroma_gen_detail::run_program(p, static_cast<int>(entry), in_ptrs.data(), out_ptrs.data(), &why, seconds.data());
    }
  }
  PyEval_RestoreThread(ts);
  if (rc == CHROMA_ERR_INDEX) {
    PyErr_SetString(PyExc_IndexError, why.c_str());
    return nullptr;
  }
  if (rc == CHROMA_ERR_ZERO_DIVISION) {
    PyErr_SetString(PyExc_ZeroDivisionError, why.c_str());
    return nullptr;
  }
  if (rc) {
    PyErr_SetString(PyExc_RuntimeError, why.c_str());
    return nullptr;
  }
  if (iters == 0) {
    Py_INCREF(Py_None);
    return Py_None;
  }
  PyObject* list = PyList_New(e.num_kernels);
  if (!list) return nullptr;
  for (int k = 0; k < e.num_kernels; ++k) PyList_SetItem(list, k, PyFloat_FromDouble(seconds[static_cast<size_t>(k)] / static_cast<double>(iters)));
  return list;
}

inline PyObject* py_reset_state(PyObject*, PyObject* cap) {
  chroma_program* p = handle(cap);
  if (!p) return nullptr;
  chroma_reset_state(p);
  Py_INCREF(Py_None);
  return Py_None;
}

// read_state(program, index, out): copies state tensor `index` into the writable buffer out.
inline PyObject* py_read_state(PyObject*, PyObject* args) {
  if (PyTuple_Size(args) != 3) {
    PyErr_SetString(PyExc_TypeError, "read_state(program, index, out) takes three arguments");
    return nullptr;
  }
  chroma_program* p = handle(PyTuple_GetItem(args, 0));
  if (!p) return nullptr;
  const long s = PyLong_AsLong(PyTuple_GetItem(args, 1));
  if (s == -1 && PyErr_Occurred()) return nullptr;
  if (s < 0 || s >= chroma_gen::kNumStates) {
    PyErr_SetString(PyExc_IndexError, "no such state tensor");
    return nullptr;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(PyTuple_GetItem(args, 2), &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) return nullptr;
  const chroma::rt::StateInfo& st = chroma_gen::kStates[s];
  if (view.len != st.nbytes) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "read_state: buffer size does not match the state tensor");
    return nullptr;
  }
  std::memcpy(view.buf, p->state + st.offset, static_cast<size_t>(st.nbytes));
  PyBuffer_Release(&view);
  Py_INCREF(Py_None);
  return Py_None;
}

inline PyObject* py_num_threads(PyObject*, PyObject* args) {
  chroma_program* p = handle(args);
  if (!p) return nullptr;
  return PyLong_FromLong(chroma_num_threads(p));
}

inline PyObject* py_source_digest(PyObject*, PyObject*) { return PyUnicode_FromString(chroma_gen::kSourceDigest); }
inline PyObject* py_abi_version(PyObject*, PyObject*) { return PyLong_FromLong(CHROMA_ABI_VERSION); }
inline PyObject* py_weights_digest(PyObject*, PyObject*) { return PyUnicode_FromString(chroma_gen::kWeightsDigest); }

inline PyObject* py_signature(PyObject*, PyObject*) { return PyUnicode_FromString(chroma_signature()); }

inline PyMethodDef kMethods[] = {
    {"open", py_open, METH_VARARGS, "open(directory, threads) -> program handle; maps and verifies weights.bin"},
    {"num_threads", py_num_threads, METH_O, "num_threads(program) -> threads the program runs on"},
    {"run", py_run, METH_VARARGS,
     "run(program, entry, inputs, outputs[, iters]): inputs/outputs are lists of C-contiguous buffers; with iters, "
     "returns mean seconds per kernel"},
    {"reset_state", py_reset_state, METH_O, "reset_state(program): state tensors back to their initial values"},
    {"read_state", py_read_state, METH_VARARGS, "read_state(program, index, out): copy a state tensor into out"},
    {"source_digest", py_source_digest, METH_NOARGS, "digest of the generated source"},
    {"signature", py_signature, METH_NOARGS, "entry points and state compiled into the library (one line each)"},
    {"abi_version", py_abi_version, METH_NOARGS, "the C ABI version"},
    {"weights_digest", py_weights_digest, METH_NOARGS, "digest (sha256-tree-16MiB) of the weights file this library was built for"},
    {nullptr, nullptr, 0, nullptr},
};

inline PyModuleDef_Slot kSlots[] = {{0, nullptr}};

inline PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "chroma_model", "A Chroma-compiled model", 0, kMethods, kSlots,
                              nullptr, nullptr, nullptr};

}  // namespace chroma_gen_py

extern "C" __attribute__((visibility("default"))) PyObject* PyInit_chroma_model(void) {
  return PyModuleDef_Init(&chroma_gen_py::kModule);
}
