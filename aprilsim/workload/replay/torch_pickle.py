"""Read a ``torch.save`` file without torch: the zip archive's ``data.pkl`` with a restricted
unpickler.

slime's debug rollout dumps are dicts of plain Python values (``Sample.to_dict()``: ints,
floats, strings, lists, dicts). Tensors come back as numpy arrays read from the archive's
storages (contiguous ones; others, and dtypes numpy lacks such as bfloat16, as a `TensorStub`
holding the shape only). Plain containers, tensors and numpy arrays are rebuilt; any other
class in the pickle (a vision-language dump's PIL images, an enum, a processor's output) becomes
an `Opaque` placeholder that keeps its name and constructor arguments but never runs its code
(unlike ``torch.load(weights_only=False)``), so replay reads the fields it needs and skips the
rest; aprilsim needs no torch.
"""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aprilsim.workload.replay.log import ReplayLogError


@dataclass(frozen=True)
class TensorStub:
    """A tensor of the dump: its shape, not its data."""

    shape: tuple[int, ...]

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1


_DTYPES = {"FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2",
           "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
           "ByteStorage": "u1", "BoolStorage": "?"}


class Opaque:
    """A placeholder for an object of a class replay does not read: its `origin` (module.name)
    and the arguments it was rebuilt from; setting its state or items does nothing."""

    origin = "?"
    counter: Counter[str] | None = None  # where objects of this placeholder are counted

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        if cls.counter is not None:
            cls.counter[cls.origin] += 1
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    @property
    def value(self) -> Any:  # an enum member pickles as Class(value)
        return self.args[0] if len(self.args) == 1 else None

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{self.origin} (not read)>"


@dataclass(frozen=True)
class _StorageType:
    name: str


@dataclass(frozen=True)
class _Storage:
    dtype: str | None
    key: str
    numel: int


_SAFE = {
    ("builtins", n) for n in ("set", "frozenset", "complex", "slice", "range", "bytearray")
} | {("collections", "OrderedDict"), ("collections", "defaultdict"), ("_codecs", "encode")}
_NUMPY = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
          ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
          ("numpy", "ndarray"), ("numpy", "dtype")}
_TORCH_SCALARS = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                  "uint8", "bool", "long", "int", "float", "double"}


class _Unpickler(pickle.Unpickler):
    def __init__(self, raw: bytes, archive: zipfile.ZipFile, prefix: str,
                 skipped: Counter[str]) -> None:
        super().__init__(io.BytesIO(raw))
        self._zip, self._prefix, self.skipped = archive, prefix, skipped
        self._opaque: dict[str, type] = {}

    def _tensor(self, storage: Any, offset: int, size: Any, stride: Any = None, *rest: Any) -> Any:
        shape = tuple(int(x) for x in size)
        n = 1
        for d in shape:
            n *= d
        contiguous = stride is None or tuple(stride) == tuple(
            math.prod(shape[i + 1:]) for i in range(len(shape)))
        if not isinstance(storage, _Storage) or storage.dtype is None or not contiguous:
            return TensorStub(shape)
        import numpy as np

        buf = self._zip.read(f"{self._prefix}data/{storage.key}")
        return np.frombuffer(buf, dtype=storage.dtype)[int(offset): int(offset) + n].reshape(shape)

    def find_class(self, module: str, name: str) -> Any:
        module = "builtins" if module == "__builtin__" else module  # protocol 2 names
        if (module, name) in _SAFE or (module, name) in _NUMPY:
            return super().find_class(module, name)
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return self._tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda data, *rest: data
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        if module == "torch" and name == "Size":
            return tuple
        if module == "torch" and (name in _TORCH_SCALARS or name == "device"):
            return name
        return self._placeholder(f"{module}.{name}")

    def _placeholder(self, origin: str) -> type:
        """An `Opaque` subclass named after `origin`, its objects counted in `skipped`."""
        cls = self._opaque.get(origin)
        if cls is None:
            cls = self._opaque[origin] = type(origin.rsplit(".", 1)[-1], (Opaque,),
                                              {"origin": origin, "counter": self.skipped})
        return cls

    def persistent_load(self, pid: Any) -> Any:
        # ('storage', storage type, key, location, numel)
        kind = pid[1].name if isinstance(pid[1], _StorageType) else str(pid[1])
        return _Storage(_DTYPES.get(kind), str(pid[2]), int(pid[4]))


def load_torch_save(path: str | Path, skipped: Counter[str] | None = None) -> Any:
    """The object a ``torch.save`` zip file holds (tensors as `TensorStub` where not plain);
    objects of other classes are `Opaque`, counted by class name in `skipped`."""
    p = Path(path)
    skipped = Counter() if skipped is None else skipped
    try:
        with zipfile.ZipFile(p) as z:
            names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                raise ReplayLogError(f"{p}: not a torch.save file (no data.pkl in the archive)")
            prefix = names[0][: -len("data.pkl")]
            try:
                return _Unpickler(z.read(names[0]), z, prefix, skipped).load()
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError,
                    KeyError, ValueError) as e:
                raise ReplayLogError(f"{p}: cannot read ({e})") from None
    except zipfile.BadZipFile:
        raise ReplayLogError(f"{p}: not a torch.save zip file (saved with "
                             "_use_new_zipfile_serialization=False? re-save it with "
                             "torch>=1.6)") from None
