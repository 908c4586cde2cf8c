"""Every verified measurement we have, as (gpu, template, workload, config, time) rows.

Sources: the results files of `benchmarks/` (format: docs/design.md, section 5; exhaustive
`tuning_tables`, the best and tried configs of `conv`, `gemm`, `tma_conv`, `bitserial` rows,
`mma_ablation` sweeps, tuner bests of `tuning_timed`, verified `config_probe` rows, the
measurement rows of `perfmodel` GPU runs), the consolidated dataset of results files that
left the tree (`CONSOLIDATED`, written by `benchmarks/consolidate.py`), and the tuner's SQLite
records (their rows passed in: `load_records`). Only verified
measurements count (a table entry without error, a tried config marked exact, a benchmark
row's chosen config, which the benchmark checked bit for bit before timing).

Timing: the tuner and the conv / GEMM benchmarks time with CUDA events around one launch
(`do_bench`, "events"); the bit-serial benchmarks and probes replay CUDA graphs ("graph"), which
leaves out about 4 us of launch overhead (`GRAPH_OFFSET_US`: the median difference, 3.96
us, of 240 same-config pairs in the conv / GEMM files of 2026-11-22..24,
`paired_graph_offsets`). Rows keep the time as measured; `Measurement.events_us` puts both
on the events scale.

The cuDNN / cuBLAS fp16 baselines join as the pseudo-template
`lowbit.kernels.base.TORCH_FP16` with an empty config (their time depends on the shape only).

Templates and configs are today's: rows of the single bit-serial template ("cuda.bitserial",
which the bit-serial families replaced) and old `cuda.int8_wgmma` configs are read through
`lowbit.kernels.cuda.migrate_config`; a row whose config no kernel of today has (a probe's
variant) is dropped.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..core import Config, ConvWorkload, Epilogue, Workload, workload_from_dict
from ..core.workloads import SUITES, load_workloads
from ..kernels.base import TORCH_FP16
from ..kernels.cuda import LEGACY, migrate_config
from .consolidated import (
    CONSOLIDATED,
    ConsolidatedFile,
    path_order,
    read_consolidated,
)
from .measurement import GRAPH_OFFSET_US, Measurement, file_stamp

_INT8_EPILOGUE = Epilogue(bias=True, relu=True, out="s8")


# ----------------------------------------------------------------------------- workloads

def _epilogue_from_key(text: str) -> Epilogue:
    """Inverse of `Epilogue.key`: 'bias+relu->u2/bitplane', 'int32', 'relu->fp16'."""
    head, arrow, out = text.rpartition("->")
    parts = set(head.split("+")) if arrow else set()
    if not arrow:
        out = text
    bad = parts - {"bias", "relu"}
    if bad:
        raise ValueError(f"epilogue key {text!r}: unknown parts {sorted(bad)}")
    name, _, layout = out.partition("/")
    kw: dict = {"bias": "bias" in parts, "relu": "relu" in parts, "out": name}
    if layout:
        kw["out_layout"] = layout
    return Epilogue(**kw)


_KEY = re.compile(r"(\w+)\(([^)]*)\)\|w=(\w+)/(\w+)\|a=(\w+)/(\w+)\|(.+)")


def workload_from_key(key: str) -> Workload:
    """Inverse of `Workload.key` (ValueError naming the key when it does not parse)."""
    m = _KEY.fullmatch(key.strip())
    if not m:
        raise ValueError(f"not a workload key: {key!r}")
    op, shape, w, wl_, a, al, epi = m.groups()
    d: dict = {"op": op, "w": w, "w_layout": wl_, "a": a, "a_layout": al,
               "epilogue": _epilogue_from_key(epi)}
    for item in shape.split(","):
        name, _, value = item.partition("=")
        d[name] = int(value)
    return workload_from_dict(d)


def _named_workloads() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for suite in SUITES:
        for name, wl in load_workloads(suite):
            out[name] = wl.to_dict()
    return out


def int8_workload(base: Workload) -> Workload:
    """The w8a8 twin of a layer, epilogue bias + ReLU -> s8 (the int8 benchmarks' layer)."""
    return base.replace(w="s8", a="s8", w_layout="int8", a_layout="int8", epilogue=_INT8_EPILOGUE)


# ----------------------------------------------------------------------------- parsers

class _Reader:
    """Turns one results document into measurements (one method per benchmark kind)."""

    def __init__(self, doc: dict, source: str, names: dict[str, dict],
                 keys_by_name: dict[tuple[str, str], str]) -> None:
        self.doc = doc
        self.gpu = doc.get("gpu", "")
        self.source = source
        self.stamp = file_stamp(source)
        self.names = names
        self.keys_by_name = keys_by_name

    def m(self, template: str, wl: Workload, config: dict, t: object, timing: str
          ) -> Measurement | None:
        if not isinstance(t, int | float) or not t > 0:
            return None
        cfg = Config({k: v for k, v in config.items() if k != "template"})
        return Measurement(self.gpu, template, wl, cfg, float(t), timing, self.source,
                           self.stamp)

    def named(self, name: str, precision: str, epilogue: str | None) -> Workload | None:
        key = self.keys_by_name.get((name, precision))
        if key is not None:
            return workload_from_key(key)
        base = self.names.get(name)
        if base is None or precision != "w8a8":
            return None
        epi = _epilogue_from_key(epilogue) if epilogue else _INT8_EPILOGUE
        return workload_from_dict(base, w="s8", a="s8", epilogue=epi)

    def read(self) -> Iterator[Measurement | None]:
        kind = self.doc.get("benchmark")
        if kind == "tuning_tables":
            yield from self.tables()
        elif kind == "bitserial":
            yield from self.bitserial()
        elif kind in ("conv", "gemm", "tma_conv"):
            yield from self.conv_gemm()
        elif kind == "mma_ablation":
            yield from self.mma_ablation()
        elif kind == "tuning_timed":
            yield from self.timed()
        elif kind == "perfmodel":
            yield from self.perfmodel()
        elif kind is None and self.source.startswith("config_probe"):
            yield from self.config_probe()

    def tables(self) -> Iterator[Measurement | None]:
        for layer in self.doc["layers"]:
            tmpl = layer.get("template", self.doc["template"])  # older files: the file's
            wl = workload_from_dict(layer["wl"])
            for cfg, t, err in layer["table"]:
                if err is None:
                    yield self.m(tmpl, wl, cfg, t, "events")

    def bitserial(self) -> Iterator[Measurement | None]:
        for r in self.doc["rows"]:
            wl = workload_from_key(r["workload_key"])
            tmpl = r.get("impl", LEGACY)
            if r.get("verified") and r.get("config"):
                yield self.m(tmpl, wl, r["config"], r.get("time_us"), "graph")
            for t in r.get("tried", ()):
                if t.get("exact"):
                    yield self.m(tmpl, wl, t["config"], t.get("us"), "graph")
            tuned = r.get("tuned")
            if tuned and tuned.get("config"):
                yield self.m(tmpl, wl, tuned["config"], tuned.get("tuner_us"), "events")
            base = r.get("baselines_us", {})
            if isinstance(wl, ConvWorkload):
                yield self.m(TORCH_FP16, int8_workload(wl), {}, base.get("cudnn_fp16"),
                             "graph")
            else:
                yield self.m(TORCH_FP16, int8_workload(wl), {}, base.get("fp16_matmul"),
                             "events")
            best = r.get("baseline_configs", {}).get("int8_best_config")
            if best:
                name = best.get("template") or ("triton.conv2d_int8_tma" if "BLOCK_I" in best
                                                else "triton.conv2d_int8"
                                                if isinstance(wl, ConvWorkload)
                                                else "triton.gemm_int8")
                yield self.m(name, int8_workload(wl), best, base.get("int8_best"), "graph")

    def conv_gemm(self) -> Iterator[Measurement | None]:
        for r in self.doc["rows"]:
            wl = self.named(r["workload"], r.get("precision", ""),
                            r.get("epilogue", self.doc.get("epilogue")))
            if wl is None:
                continue
            base = r.get("baselines_us", {})
            graph = r.get("cuda_graph_us") or {}
            yield self.m(r["impl"], wl, r["config"], r.get("time_us"), "events")
            yield self.m(r["impl"], wl, r["config"], graph.get("triton"), "graph")
            fp16 = base.get("cudnn_fp16", base.get("fp16_matmul"))
            yield self.m(TORCH_FP16, int8_workload(wl), {}, fp16, "events")
            igemm = r.get("igemm_config")
            if igemm:
                yield self.m("triton.conv2d_int8", wl, igemm, base.get("triton.conv2d_int8"),
                             "events")
            for key, name in (("cuda_int8_wgmma", "cuda.int8_wgmma"),
                              ("triton_gemm_int8", "triton.gemm_int8")):
                other = r.get(key)
                if other and other.get("config"):
                    yield self.m(name, wl, other["config"], other.get("time_us"), "events")
                    yield self.m(name, wl, other["config"], other.get("graph_us"), "graph")

    def mma_ablation(self) -> Iterator[Measurement | None]:
        from ..core import Epilogue as Epi

        epi = Epi(bias=True, relu=True, out="u4", out_layout="packed")
        for layer in self.doc.get("sweep", ()):
            base = self.names.get(layer["workload"])
            if base is None:
                continue
            wl = workload_from_dict(base, w="s8", a="u8", epilogue=epi)
            for res in layer["results"]:
                if res.get("verified"):
                    yield self.m("cuda.mma_conv_s8", wl, res["config"], res.get("time_us"),
                                 "events")

    def timed(self) -> Iterator[Measurement | None]:
        for r in self.doc["rows"]:
            tmpl = r.get("best_template") or self.doc.get("template")
            if tmpl and r.get("best_config") and r.get("key"):
                yield self.m(tmpl, workload_from_key(r["key"]), r["best_config"],
                             r.get("best_us"), "events")

    def perfmodel(self) -> Iterator[Measurement | None]:
        for r in self.doc["rows"]:
            if r.get("kind") == "measurement" and r.get("error") is None and r.get("wl"):
                yield self.m(r["template"], workload_from_dict(r["wl"]), r["config"],
                             r.get("time_us"), "events")
            elif r.get("kind") == "dispatch" and r.get("wl_fp16"):
                yield self.m(TORCH_FP16, workload_from_dict(r["wl_fp16"]), {},
                             r.get("cudnn_fp16_us"), "events")

    def config_probe(self) -> Iterator[Measurement | None]:
        for r in self.doc["rows"]:
            if not r.get("exact"):
                continue
            wl = self.named(r.get("workload", ""), r.get("precision", ""), None)
            if wl is not None:
                yield self.m(LEGACY, wl, r["config"], r.get("us"), "graph")


def _result_docs(paths: Iterable[Path], root: Path | None = None) -> list[tuple[str, dict]]:
    """(path, document) of the results documents among `paths`, in path order: the path
    relative to `root` (posix), or the file name without `root`."""
    docs = []
    for p in sorted(paths):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows", doc.get("layers")), list):
            docs.append((p.relative_to(root).as_posix() if root else p.name, doc))
    return docs


def _keys_by_name(docs: Iterable[tuple[str, dict]]) -> dict[tuple[str, str], str]:
    """(workload name, precision) -> workload key, from rows that carry both."""
    out: dict[tuple[str, str], str] = {}
    for _, doc in docs:
        for r in doc.get("rows", ()):
            if isinstance(r, dict) and "workload_key" in r and "workload" in r:
                out[(r["workload"], r.get("precision", ""))] = r["workload_key"]
    return out


def _read(doc: dict, source: str, names: dict[str, dict],
          by_name: dict[tuple[str, str], str]) -> list[Measurement]:
    """The raw measurements of one document (none for a format the reader does not know)."""
    try:
        return [m for m in _Reader(doc, source, names, by_name).read() if m is not None]
    except (KeyError, TypeError, ValueError):
        return []  # a results format this reader does not know: skip the whole file


def load_results(root: str | Path, complete: bool = True) -> list[Measurement]:
    """Every verified measurement in the results files under `root` (searched recursively;
    a file that is not a results document is skipped) and its consolidated dataset (`root /
    CONSOLIDATED`; a file back in the tree replaces its record), in path order, as today's
    templates know them (`migrated`), configs completed (`complete_configs`), not yet
    deduplicated."""
    root = Path(root)
    docs = _result_docs(root.rglob("*.json"), root)
    archive = _archive(root)
    names = _named_workloads()
    by_name = _merged_keys(docs, archive)
    parts = [(path_order(path), lambda d=doc, p=path: _read(d, Path(p).name, names, by_name))
             for path, doc in docs]
    parts += [(path_order(r.path), lambda r=r: list(r.measurements)) for r in archive]
    out = [m for _, read in sorted(parts, key=lambda t: t[0]) for m in read()]
    out = migrated(out)
    return complete_configs(out) if complete else out


def table_spaces(root: str | Path) -> dict[tuple[str, str, str], dict]:
    """(gpu, template, workload key) -> what the exhaustive tables files (`tuning_tables`,
    benchmarks/tuning.py measure) under `root` say of that space: {"layer": the layer's name,
    "space_size": configs in the template's space then, "measured": rows (a time or an error),
    "failed": rows with an error, "exhaustive": whether every config of the space has a row,
    "source": the file}. Files written before these fields existed held whole layers only
    (exhaustive, space_size = rows). Several files of one space: an exhaustive one wins, then
    the later one. Files only in the consolidated dataset are not read."""
    out: dict[tuple[str, str, str], dict] = {}
    root = Path(root)
    for path, doc in _result_docs(root.rglob("*.json"), root):
        if doc.get("benchmark") != "tuning_tables":
            continue
        try:
            for layer in doc["layers"]:
                table = layer["table"]
                key = (doc.get("gpu", ""), layer.get("template", doc["template"]),
                       workload_from_dict(layer["wl"]).key)
                info = {"layer": layer.get("workload", ""),
                        "space_size": int(layer.get("space_size", len(table))),
                        "measured": len(table),
                        "failed": sum(err is not None for _, _, err in table),
                        "exhaustive": bool(layer.get("exhaustive", True)), "source": path}
                have = out.get(key)
                if have is None or info["exhaustive"] or not have["exhaustive"]:
                    out[key] = info
        except (KeyError, TypeError, ValueError):
            continue  # a tables format this reader does not know
    return out


def _merged_keys(docs: list[tuple[str, dict]], archive: list[ConsolidatedFile]
                 ) -> dict[tuple[str, str], str]:
    """`_keys_by_name` over the files and the consolidated ones, in path order (a later
    file's key wins, as among files)."""
    entries = [(path_order(p), _keys_by_name([(p, d)])) for p, d in docs]
    entries += [(path_order(r.path), dict(r.workload_keys)) for r in archive]
    out: dict[tuple[str, str], str] = {}
    for _, keys in sorted(entries, key=lambda t: t[0]):
        out.update(keys)
    return out


def load_records(records: Iterable, gpu: str | None = None, source: str = "records"
                 ) -> list[Measurement]:
    """The successful measurements among tuning records (`lowbit.tune.records.Record` rows,
    e.g. a `RecordsDB`, which iterates over its rows), of `gpu` where given, as today's
    templates know them (`migrated`). `source`: what the rows say they come from."""
    out = []
    for r in records:
        if r.time_us is None or r.time_us <= 0 or (gpu is not None and r.gpu != gpu):
            continue
        try:
            wl = (workload_from_dict(json.loads(r.workload_json)) if r.workload_json
                  else workload_from_key(r.workload))
        except (ValueError, TypeError):
            continue
        stamp = f"{r.timestamp:017.6f}"
        out.append(Measurement(r.gpu, r.template, wl, r.cfg, float(r.time_us), "events",
                               source, stamp))
    return migrated(out)


def migrated(ms: Iterable[Measurement]) -> list[Measurement]:
    """Every row as today's templates know it (`lowbit.kernels.cuda.migrate_config`), the rows
    it rejects (a config no kernel of today has) dropped."""
    out = []
    for m in ms:
        try:
            name, cfg = migrate_config(m.template, m.config)
        except ValueError:
            continue
        out.append(m if name == m.template and cfg == m.config else
                   Measurement(m.gpu, name, m.workload, Config(cfg), m.time_us, m.timing,
                               m.source, m.stamp))
    return out


def complete_configs(ms: Iterable[Measurement]) -> list[Measurement]:
    """Configs recorded before a knob existed, completed with the value they meant (the
    template's `added_knobs`, for templates registered here), so that old and new records
    of one kernel are one config; configs whose knobs still differ from today's space (a
    probe's variant of the kernel, or a kernel from before a knob that has no old meaning)
    are dropped."""
    from ..kernels import get_template, load_backends

    load_backends()
    names: dict[tuple[str, str], tuple[frozenset[str], dict] | None] = {}
    out = []
    for m in ms:
        key = (m.template, m.workload.key)
        if key not in names:
            try:
                tmpl = get_template(m.template)
                names[key] = (frozenset(tmpl.space(m.workload).names), dict(tmpl.added_knobs))
            except Exception:  # unregistered, or no space here (another arch): keep as is
                names[key] = None
        if names[key] is None:
            out.append(m)
            continue
        known, added = names[key]
        missing = {k: v for k, v in added.items() if k in known and k not in m.config}
        cfg = Config({**missing, **m.config}) if missing else m.config
        if set(cfg) == known:
            out.append(m if cfg is m.config else Measurement(
                m.gpu, m.template, m.workload, cfg, m.time_us, m.timing, m.source, m.stamp))
    return out


def deduplicate(ms: Iterable[Measurement]) -> list[Measurement]:
    """One row per (gpu, template, workload, config): the latest measurement, events timing
    preferred over graph timing of the same stamp (kernels change between sessions: the
    latest one measured the code that is closest to today's)."""
    best: dict[tuple, Measurement] = {}
    for m in ms:
        key = (m.gpu, m.template, m.workload.key, m.config)
        rank = (m.stamp, m.timing == "events")
        have = best.get(key)
        if have is None or rank > (have.stamp, have.timing == "events"):
            best[key] = m
    return sorted(best.values(), key=lambda m: (m.gpu, m.template, m.workload.key, m.stamp))


def paired_graph_offsets(root: str | Path) -> list[float]:
    """events - graph time of the same config in the same row (conv / GEMM results files,
    and those of the consolidated dataset under `root`)."""
    root = Path(root)
    out = [x for r in _archive(root) for x in r.graph_offsets]
    for _, doc in _result_docs(root.rglob("*.json")):
        out += _graph_offsets(doc)
    return out


def _graph_offsets(doc: dict) -> list[float]:
    if doc.get("benchmark") not in ("conv", "gemm"):
        return []
    out = []
    for r in doc["rows"]:
        graph = r.get("cuda_graph_us") or {}
        if isinstance(graph.get("triton"), float) and isinstance(r.get("time_us"), float):
            out.append(r["time_us"] - graph["triton"])
        base = r.get("baselines_us", {})
        if isinstance(graph.get("cudnn_fp16"), float) and "cudnn_fp16" in base:
            out.append(base["cudnn_fp16"] - graph["cudnn_fp16"])
    return out


# ----------------------------------------------------------------------------- consolidated

def consolidate(root: str | Path, paths: Iterable[str | Path]) -> list[ConsolidatedFile]:
    """The results files `paths` (under `root`) as consolidated records: what
    `load_results(root)` reads from each, with its provenance. Named workloads resolve
    through every file and consolidated record under `root`, as in `load_results`."""
    root = Path(root)
    docs = _result_docs(root.rglob("*.json"), root)
    by_name = _merged_keys(docs, _archive(root))
    names = _named_workloads()
    wanted = {Path(p).resolve().relative_to(root.resolve()).as_posix() for p in paths}
    out = []
    for path, doc in docs:
        if path not in wanted:
            continue
        name = Path(path).name
        stamp = file_stamp(name)[:8]
        date = doc.get("date") or (f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:]}" if stamp else "")
        rows = doc.get("rows", doc.get("layers"))
        out.append(ConsolidatedFile(
            path, str(doc.get("benchmark") or name.split("-")[0]), doc.get("gpu", ""), date,
            doc.get("versions") or {}, len(rows), tuple(_read(doc, name, names, by_name)),
            tuple(_keys_by_name([(path, doc)]).items()), tuple(_graph_offsets(doc))))
    return out


def _archive(root: Path) -> list[ConsolidatedFile]:
    """The consolidated records under `root` whose file is not in the tree (a file that
    came back replaces its record)."""
    return [r for r in read_consolidated(root / CONSOLIDATED) if not (root / r.path).exists()]


# ----------------------------------------------------------------------------- snapshot

SNAPSHOT = Path(__file__).with_name("measurements.jsonl.gz")


def save_snapshot(ms: Iterable[Measurement], path: str | Path = SNAPSHOT) -> int:
    """Write measurements as gzipped JSON lines; returns the count."""
    rows = [json.dumps(m.to_dict(), sort_keys=True) for m in ms]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + ("\n" if rows else ""))
    return len(rows)


def load_snapshot(path: str | Path = SNAPSHOT) -> list[Measurement]:
    """The measurements `save_snapshot` wrote (the packaged H100 / H200 snapshot by
    default; an empty list when the file is missing)."""
    p = Path(path)
    if not p.exists():
        return []
    with gzip.open(p, "rt") as f:
        return [Measurement.from_dict(json.loads(line)) for line in f if line.strip()]


def summary(ms: Iterable[Measurement]) -> dict[tuple[str, str], tuple[int, int]]:
    """(gpu, template) -> (layers, measurements)."""
    layers: dict[tuple[str, str], set[str]] = {}
    counts: dict[tuple[str, str], int] = {}
    for m in ms:
        k = (m.gpu, m.template)
        layers.setdefault(k, set()).add(m.workload.key)
        counts[k] = counts.get(k, 0) + 1
    return {k: (len(layers[k]), counts[k]) for k in sorted(counts)}


def median_offset(offsets: list[float]) -> float:
    return statistics.median(offsets) if offsets else GRAPH_OFFSET_US
