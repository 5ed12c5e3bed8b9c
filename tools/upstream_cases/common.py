"""Shared machinery of the upstream-test case extractor (issue 34).

Each library module reads its test files at the commit the capability file names, takes the
`pytest.mark.parametrize` grids of chosen test functions (with `ast`, never by running them),
and turns the inputs the tests run into accept cases and the ones they skip or expect to
raise into reject cases, each citing the upstream line it comes from. A skip condition is
re-checked against the file: the module quotes the line's text and `Source.line_of` finds it,
so a moved or changed condition fails loudly instead of citing the wrong line.
"""

import ast
import itertools
import json
import os
import subprocess
from dataclasses import dataclass, field


class UpstreamChanged(Exception):
    """A quoted upstream line is no longer in the file."""


@dataclass
class Source:
    """One upstream file at one commit, read from a local git mirror, or from a plain directory
    holding the files as they are at that commit (a repository too large to mirror; `commit`
    is then only cited)."""

    mirror: str
    commit: str
    path: str
    text: str = ""

    def __post_init__(self):
        if _is_plain_tree(self.mirror):
            with open(os.path.join(self.mirror, self.path), encoding="utf-8", newline="") as f:
                self.text = f.read()
        else:
            out = subprocess.run(
                ["git", "--git-dir", self.mirror, "show", f"{self.commit}:{self.path}"],
                check=True,
                capture_output=True,
            )
            self.text = out.stdout.decode("utf-8")
        self.lines = self.text.splitlines()
        self.tree = ast.parse(self.text)

    def line_of(self, needle, after=0):
        """The 1-based line holding `needle` (the first after line `after`)."""
        for i, line in enumerate(self.lines[after:], start=after + 1):
            if needle in line:
                return i
        raise UpstreamChanged(f"{self.path}@{self.commit[:12]}: no line holds {needle!r}")

    def cite(self, needle, after=0):
        """`path:line` of `needle`."""
        return f"{self.path}:{self.line_of(needle, after)}"

    def function(self, name):
        """The test function `name` (a module-level def or one in a class)."""
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node
        raise UpstreamChanged(f"{self.path}@{self.commit[:12]}: no function {name}")

    def grid(self, name, names=None):
        """The parametrize grid of test function `name`: {arg: (values, line)}. Values that
        are not literals are kept as their source text (`torch.float16` -> "torch.float16")."""
        fn = self.function(name)
        grid = {}
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and _dotted(dec.func).endswith("parametrize")):
                continue
            if len(dec.args) < 2:
                continue
            argnames = _literal(dec.args[0])
            values = _values(dec.args[1], self.text)
            if isinstance(argnames, str):
                keys = [a.strip() for a in argnames.split(",")]
            else:
                keys = list(argnames)
            if len(keys) == 1:
                grid[keys[0]] = (values, dec.lineno)
            else:
                grid[tuple(keys)] = (values, dec.lineno)
        if names is not None:
            missing = [n for n in names if n not in grid]
            if missing:
                raise UpstreamChanged(f"{self.path}:{fn.lineno} {name} has no parametrize for {missing}")
        return grid


def _is_plain_tree(path):
    """A directory that is neither a git directory (no HEAD) nor a checkout (no .git)."""
    return os.path.isdir(path) and not any(os.path.exists(os.path.join(path, n)) for n in ("HEAD", ".git"))


def _dotted(node):
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _values(node, text):
    """A parametrize value list: literals as Python values, anything else as source text."""
    if isinstance(node, (ast.List, ast.Tuple)):
        out = []
        for elt in node.elts:
            v = _literal(elt)
            out.append(v if v is not None or _is_none(elt) else ast.get_source_segment(text, elt))
        return out
    v = _literal(node)
    if v is not None:
        return list(v)
    return [ast.get_source_segment(text, node)]


def _is_none(node):
    return isinstance(node, ast.Constant) and node.value is None


def product(axes):
    """Every combination of `axes` ({name: values}) as dicts, in order."""
    keys = list(axes)
    for combo in itertools.product(*(axes[k] for k in keys)):
        yield dict(zip(keys, combo))


@dataclass
class Fixture:
    """The cases of one library."""

    library: str
    repository: str
    commit: str
    cases: list = field(default_factory=list)
    unexpressible: list = field(default_factory=list)

    def case(self, *, name, source, kernel, hardware, expect, request, why):
        """An input a test runs (`expect` "accept") or skips / expects to raise ("reject")."""
        assert expect in ("accept", "reject"), expect
        key = json.dumps([kernel, hardware, request], sort_keys=True)
        if any(c["_key"] == key for c in self.cases):
            return
        self.cases.append(
            {
                "_key": key,
                "name": name,
                "source": source,
                "kernel": kernel,
                "hardware": hardware,
                "expect": expect,
                "why": why,
                "request": request,
            }
        )

    def lacks(self, *, name, source, missing, why):
        """An input a test runs that no request can express: the field LayerZero lacks."""
        entry = {"name": name, "source": source, "missing": missing, "why": why}
        if entry not in self.unexpressible:
            self.unexpressible.append(entry)

    def to_json(self):
        cases = [{k: v for k, v in c.items() if k != "_key"} for c in self.cases]
        return {
            "schema_version": 1,
            "library": self.library,
            "repository": self.repository,
            "commit": self.commit,
            "generated_by": "tools/upstream_cases/main.py",
            "cases": cases,
            "unexpressible": self.unexpressible,
        }


DTYPES = {
    "torch.float16": "f16",
    "torch.half": "f16",
    "torch.bfloat16": "bf16",
    "torch.float32": "f32",
    "torch.float": "f32",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
}


def dtype(text):
    """LayerZero's dtype name for a torch dtype's source text (None when it has none)."""
    return DTYPES.get(text)
