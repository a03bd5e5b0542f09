"""gpufeed.DataLoader's keywords: the schema declared in C++ (gpufeed/option.h), the checks of
the Python values, the front keywords that are DataLoader's own, and the signature and docstring
built from the schema."""
from __future__ import annotations

import dataclasses
import numbers
import operator
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import _C
from ._views import _from_distributed_sampler, distributed_rank_world_size

_DTYPES = {torch.uint8: "uint8", torch.float32: "float32", torch.bfloat16: "bfloat16",
           torch.float16: "float16"}
# The keywords declared once in C++, beside their options structs (gpufeed/option.h): name, type,
# help, unit, accepted values and default. The signature, the type checks and the docstring's
# keyword list come from them; their values are checked by the same code as the CLI's flags.
_SPECS: Dict[str, Dict[str, Any]] = {s["name"]: s for s in _C.option_specs()}
# gpufeed.DataLoader's own keywords (torch's: where batches go, their layout, the sampler's shard).
_FRONT_KEYWORDS = ("device", "dtype", "memory_format", "shuffle", "rank", "world_size", "sampler", "extensions",
                   "labels_only")
# Where gpufeed.DataLoader's default is not the C++ struct's, as the rows declare it
# (Spec::python_default): torch.utils.data.DataLoader's batch_size=1 (the CLI's bench uses
# LoaderOptions' 256).
_PYTHON_DEFAULTS: Dict[str, Any] = {n: s["python_default"] for n, s in _SPECS.items()
                                    if s["python_default"] is not None}
IMAGENET_MEAN = tuple(_SPECS["mean"]["default"])
IMAGENET_STD = tuple(_SPECS["std"]["default"])
# torchvision.datasets.folder.IMG_EXTENSIONS: the files torchvision's ImageFolder lists.
TORCHVISION_IMG_EXTENSIONS = tuple(_C.TORCHVISION_IMG_EXTENSIONS)


def _integer(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """`value` as an int (bool refused), else TypeError; outside [low, high] ValueError; both naming
    the keyword."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    value = operator.index(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bounds}, not {value}")
    return value


_INT64_MAX = 2**63 - 1


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _keyword_value(name: str, value: Any) -> Any:
    """A schema keyword's Python value as the C++ check takes it (bool, int, float, str or a list
    of floats): TypeError naming the keyword for a value of the wrong type; the C++ side raises
    ValueError for a refused value."""
    spec = _SPECS[name]
    kind = spec["type"]
    if kind == "bool":
        return bool(value)
    if kind == "int":
        if isinstance(value, str) and spec["words"]:
            return value  # num_workers="auto"; another word is refused in C++ (ValueError)
        if spec["seed_range"]:  # torch.manual_seed's range; seed s orders as s mod 2**64 (as torch's)
            value = _integer(name, value, -2**63, 2**64 - 1)
            return value - 2**64 if value > _INT64_MAX else value
        value = _integer(name, value)
        if not -2**63 <= value <= _INT64_MAX:
            raise ValueError(f"{name}={value} is out of range ({spec['accepted']})")
        return value
    if kind in ("choice", "str"):
        if kind == "str" and isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise TypeError(f"{name} must be {spec['accepted']}, not {type(value).__name__} {value!r}")
        return value
    if kind == "float":
        if isinstance(value, str):
            return value  # one of the words (random_erase_value="random"), checked in C++
        if not _is_number(value):
            raise TypeError(f"{name} must be {spec['accepted']}, not {type(value).__name__} {value!r}")
        return float(value)
    # floats: a number or a sequence of numbers
    if _is_number(value):
        return [float(value)]
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {spec['accepted']}, not {value!r}") from None


def _schema_keywords(options: Dict[str, Any]) -> Dict[str, Any]:
    """The schema keywords given (None: the default), checked for type; TypeError for an unknown
    keyword, as a Python function raises, with the nearest name."""
    out = {}
    for name, value in options.items():
        if name not in _SPECS:
            import difflib
            near = difflib.get_close_matches(name, list(_SPECS) + list(_FRONT_KEYWORDS), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"gpufeed.DataLoader() got an unexpected keyword argument {name!r}{hint}")
        if value is None:
            if name == "batch_size":
                raise TypeError("batch_size=None (unbatched samples, as torch's DataLoader) is not supported: "
                                "gpufeed.DataLoader yields batches; use loader.dataset for single samples")
            continue
        out[name] = _keyword_value(name, value)
    for name, default in _PYTHON_DEFAULTS.items():
        out.setdefault(name, default)
    return out


def _keyword_default(name: str) -> Any:
    """The default gpufeed.DataLoader shows for a schema keyword (None: derived from others)."""
    if name in _PYTHON_DEFAULTS:
        return _PYTHON_DEFAULTS[name]
    return _SPECS[name]["default"]


def _keyword_doc(spec: Dict[str, Any]) -> str:
    """One docstring entry, from the schema."""
    default = spec["derived_default"] or repr(_keyword_default(spec["name"]))
    unit = f", {spec['unit']}" if spec["unit"] else ""
    return f"        {spec['name']}: {spec['help']} ({spec['accepted']}{unit}; default {default})."


def _extensions(value: Optional[Sequence[str]]) -> List[str]:
    """The file extensions folders are listed with (None: torchvision's IMG_EXTENSIONS)."""
    if value is None:
        return list(TORCHVISION_IMG_EXTENSIONS)
    if isinstance(value, str):
        value = (value,)
    out = []
    for e in value:
        if not isinstance(e, str) or not e.startswith(".") or len(e) < 2:
            raise ValueError(f"extensions must be names such as '.jpg' (with the dot), not {e!r}")
        out.append(e.lower())
    return out



@dataclasses.dataclass(frozen=True)
class Keywords:
    """gpufeed.DataLoader's keywords, checked and resolved (resolve_keywords)."""

    root: Union[str, List[str]]  # one dataset's path, or (a list given) the sources' paths
    paths: List[str]  # the datasets to open: [root] or the sources
    schema: Dict[str, Any]  # the schema keywords given (None: left out), checked for type; the seed a sampler= gave
    device: torch.device  # "cuda" resolved to the current CUDA device
    dtype: torch.dtype
    memory_format: torch.memory_format
    shuffle: bool
    rank: int
    world_size: int
    seed: int
    sampler_drop_last: bool  # a DistributedSampler's drop_last (False without one)
    labels_only: bool
    extensions: List[str]
    view_rows: List[Dict[str, Any]]  # views= given view by view (checked for type); [] otherwise

    def in_force(self, name: str) -> Any:
        """A schema keyword's value as the loader runs it: the given one, else the default."""
        return self.schema[name] if name in self.schema else _keyword_default(name)


def resolve_keywords(root: Any, options: Dict[str, Any], *, device: Any, dtype: Any, memory_format: Any,
                     shuffle: bool, rank: Optional[int], world_size: Optional[int], sampler: Any,
                     extensions: Optional[Sequence[str]], labels_only: bool) -> Keywords:
    """gpufeed.DataLoader's keywords checked and resolved: the schema's (`options`) for type, its own
    (the front keywords) for type and value, the shard from `sampler` (a DistributedSampler) or
    torch.distributed / torchrun's environment when rank or world_size is None. TypeError for a
    value of the wrong type or an unknown keyword, ValueError for a refused value; both name the
    keyword."""
    paths = [_path(r) for r in root] if isinstance(root, (list, tuple)) else [_path(root)]
    if not paths:
        raise ValueError("root: an empty list names no dataset (give a path, or a list of sources to mix)")
    root = paths if isinstance(root, (list, tuple)) else paths[0]
    options = dict(options)
    view_rows = _view_rows(options.pop("views")) if isinstance(options.get("views"), (list, tuple)) else []
    keywords = _schema_keywords(options)
    labels_only = bool(labels_only)
    if labels_only and keywords.get("on_error") == "skip":
        raise ValueError("labels_only=True with on_error='skip': a skipped sample is replaced by another, "
                         "which only decoding finds out, so labels read off the listing would not match "
                         "the image loader's; send the image loader's labels instead")
    if rank is not None:
        rank = _integer("rank", rank, 0)
    if world_size is not None:
        world_size = _integer("world_size", world_size, 1)
    _check_layout(dtype, memory_format)
    device = torch.device(device)
    _check_slots_for_views(keywords, dtype, device)
    decode_device = options.get("decode_device", "cpu")
    if decode_device != "cpu" and device.type != "cuda" and not labels_only:
        raise ValueError(f"decode_device={decode_device!r} decodes JPEGs on the CUDA device the batches go to: "
                         f"give device='cuda', or use decode_device='cpu' (device={str(device)!r})")
    seed = 0 if options.get("seed") is None else _integer("seed", options["seed"])
    sampler_drop_last = False
    if sampler is not None:
        shuffle, seed, sampler_drop_last, rank, world_size = _from_distributed_sampler(
            sampler, shuffle, seed, rank, world_size)
        keywords["seed"] = _keyword_value("seed", seed)
    rank, world_size = _shard(rank, world_size)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return Keywords(root=root, paths=paths, schema=keywords, device=device, dtype=dtype, memory_format=memory_format,
                    shuffle=bool(shuffle), rank=rank, world_size=world_size, seed=int(seed),
                    sampler_drop_last=bool(sampler_drop_last), labels_only=labels_only,
                    extensions=_extensions(extensions), view_rows=view_rows)


def _path(root: Any) -> str:
    """A dataset's path as str; TypeError for anything but str, bytes and os.PathLike."""
    if isinstance(root, bytes):
        return os.fsdecode(root)
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path (str or os.PathLike) or a list of them, not {type(root).__name__}")
    return os.fspath(root)


# The keywords one view is written with (views=[{...}, ...]): the transform's, less train and
# resize_size, as gpufeed.views_preset returns them.
_VIEW_KEYWORDS = tuple(_C.views_preset("dino")[0])


def _view_rows(views: Sequence[Any]) -> List[Dict[str, Any]]:
    """views= given view by view: each a dict of view keywords, checked for type as the schema's
    keywords are (the C++ side checks the values). TypeError / ValueError name the view."""
    if not views:
        raise ValueError("views must name a preset or list at least one view, not an empty list")
    rows = []
    for k, view in enumerate(views):
        if not isinstance(view, dict):
            raise TypeError(f"views[{k}] must be a dict of view keywords ({', '.join(_VIEW_KEYWORDS)}), "
                            f"not {type(view).__name__}")
        row = {}
        for name, value in view.items():
            if name not in _VIEW_KEYWORDS:
                raise ValueError(f"views[{k}]: {name!r} is not a view keyword (accepted: {', '.join(_VIEW_KEYWORDS)})")
            row[name] = _keyword_value(name, value)
        rows.append(row)
    return rows


def _check_layout(dtype: Any, memory_format: Any) -> None:
    """ValueError for a dtype or memory_format gpufeed.DataLoader does not yield."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {list(_DTYPES)}, not {dtype}")
    if memory_format not in (torch.contiguous_format, torch.channels_last):
        raise ValueError(f"memory_format must be torch.contiguous_format or torch.channels_last, "
                         f"not {memory_format}")


def _check_slots_for_views(keywords: Dict[str, Any], dtype: torch.dtype, device: torch.device) -> None:
    """ValueError for one batch slot when batches are views of the slots (uint8 on the CPU)."""
    depth = keywords.get("prefetch_depth", _keyword_default("prefetch_depth"))
    if isinstance(depth, int) and depth < 2 and dtype == torch.uint8 and device.type == "cpu":
        raise ValueError(
            "prefetch_depth=1 with dtype=torch.uint8 on the CPU: those batches are views of the "
            "loader's slots, and a `for images, labels in loader` loop still holds the previous "
            "batch when it asks for the next, so one slot can never be refilled; use "
            "prefetch_depth >= 2 (or a float dtype, whose batches are copies)")


def _shard(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """(rank, world_size), a None one from torch.distributed or torchrun's environment; ValueError
    for a rank outside [0, world_size)."""
    if rank is None or world_size is None:
        env_rank, env_world = distributed_rank_world_size()
        rank = env_rank if rank is None else rank
        world_size = env_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def document_schema_keywords(loader_class: type) -> None:
    """DataLoader's signature and docstring: its own keywords, then the schema's, keyword-only,
    with the defaults gpufeed.DataLoader applies (inspect.signature and help() show them)."""
    import inspect
    own = inspect.signature(loader_class.__init__)
    params = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD and p.name != "_sample_only"]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_keyword_default(name))
               for name in _SPECS]
    loader_class.__init__.__signature__ = own.replace(parameters=params)
    loader_class.__doc__ = loader_class.__doc__.replace(
        "{keywords}", "\n".join(_keyword_doc(spec) for spec in _SPECS.values()))

