"""popkit's HIP-on-CUDA hook, loaded by Python at start-up in the processes of `popkit test --hip-on-cuda`
(this folder is put on their PYTHONPATH, and POPKIT_HIP_ON_CUDA names the mapping's include folder).

When the submission imports torch.utils.cpp_extension, load_inline is wrapped: the AMD flags go
(--offload-arch), the include folder whose <hip/hip_runtime.h> maps HIP onto CUDA comes first, and
CXX is what it was before the submission set it to clang++ for the AMD runner. The user's file is
not changed. Any other sitecustomize on the path still runs.
"""

import importlib.abc
import importlib.util
import inspect
import os
import sys

_INCLUDE = os.environ.get("POPKIT_HIP_ON_CUDA", "")
_CXX = os.environ.get("CXX")


def _patch(module):
    original = module.load_inline

    def load_inline(*args, **kwargs):
        bound = inspect.signature(original).bind(*args, **kwargs)
        params = bound.arguments
        flags = params.get("extra_cuda_cflags") or []
        params["extra_cuda_cflags"] = [f for f in flags if not str(f).startswith("--offload-arch")]
        params["extra_include_paths"] = [_INCLUDE, *(params.get("extra_include_paths") or [])]
        if _CXX is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = _CXX
        return original(*bound.args, **bound.kwargs)

    load_inline.__wrapped__ = original
    module.load_inline = load_inline


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.utils.cpp_extension":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module
        return spec


def _next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.dirname(os.path.abspath(candidate)) != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_popkit_next_sitecustomize", candidate)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if _INCLUDE:
    sys.meta_path.insert(0, _Hook())
_next_sitecustomize()
