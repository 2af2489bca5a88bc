"""The IR: a static-shape graph of primitive ops, as plain data.

Every stage of the pipeline reads or extends one `Graph`: tracing appends the forward
nodes, `grad.py` appends the backward nodes, `optim.py` appends the optimizer update and
declares *writebacks* (new values for persistent buffers), `dce.py` prunes what no output
needs, and the executors (reference, torch, webgpu) walk the node list in order — it is
always topologically sorted because nodes are only ever appended.

Leaves are nodes with no inputs:
  input  -- a per-step feed (attrs: name)
  param  -- a trainable persistent buffer (attrs: name)
  state  -- a persistent non-trainable buffer: optimizer moments, the step counter, cached
            gradients; later KV caches (attrs: name)
  const  -- a value baked into the program (attrs: value, a float/int or a flat tuple)
  arange -- 0..n-1 along the last axis (attrs: n)
Persistent buffers (param, state) are read at the start of a run; writebacks land after
every node has run, so a graph always sees the values from before the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

# f16 is a storage type: values are rounded to IEEE binary16 where a node says so (a cast
# to f16, the operands of a matmul under precision="mixed"/"f16": precision.py), and every
# op but cast, matmul and the layout ops reads f32, so the arithmetic stays in f32
DTYPES = ("f32", "i32", "f16")


@dataclass(eq=False)
class Node:
    id: int
    op: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: dict = field(default_factory=dict)
    loc: str | None = None  # the user's source line that created it, for error messages

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def type_str(self) -> str:
        """`f32[256,64]`: how the IR text and error messages write a node's type."""
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(eq=False)
class Graph:
    nodes: list[Node] = field(default_factory=list)
    inputs: dict[str, int] = field(default_factory=dict)   # feed name -> node id
    params: dict[str, int] = field(default_factory=dict)   # param name -> node id
    state: dict[str, int] = field(default_factory=dict)    # state name -> node id
    outputs: dict[str, int] = field(default_factory=dict)  # "loss"/"output", "capture:x", ...
    writebacks: dict[str, int] = field(default_factory=dict)  # persistent name -> node id
    seed: int = 0  # the compile seed; random ops fold it into their keys at trace time
    training: bool = True  # False in inference graphs (compile_forward): dropout is identity

    def add(self, op, inputs, shape, dtype, attrs=None, loc=None) -> int:
        assert dtype in DTYPES, dtype
        node = Node(len(self.nodes), op, tuple(inputs), tuple(int(s) for s in shape), dtype,
                    dict(attrs or {}), loc)
        self.nodes.append(node)
        if op in ("input", "param", "state"):
            table = {"input": self.inputs, "param": self.params, "state": self.state}[op]
            name = node.attrs["name"]
            if name in table:
                raise ValueError(f"duplicate {op} name {name!r}")
            table[name] = node.id
        return node.id

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def consumers(self) -> dict[int, list[int]]:
        """Node id -> the ids of the nodes that read it, each once, in graph order."""
        cons: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                cons[i].append(n.id)
        return cons

    def ancestors(self, node: int) -> set[int]:
        """node and every node it reads, directly or not."""
        seen, stack = set(), [node]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(self.nodes[n].inputs)
        return seen

    def roots(self) -> list[int]:
        """Ids every executor must compute: outputs and writeback values."""
        return list(dict.fromkeys([*self.outputs.values(), *self.writebacks.values()]))

    def __str__(self) -> str:
        return format_graph(self)

    __repr__ = object.__repr__


def _fmt_attr(v) -> str:
    if isinstance(v, tuple) and len(v) > 8:
        return f"<{len(v)} values>"
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v) if isinstance(v, str) else str(v)


def format_graph(g: Graph) -> str:
    """Readable IR text, one node per line: `%7: f32[256,64] = matmul %3, %5`."""
    lines = []
    for n in g.nodes:
        args = ", ".join(f"%{i}" for i in n.inputs)
        attrs = " ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs.items()
                         if k not in ("shape", "dtype") or n.inputs)  # a leaf's type is shown already
        lines.append(f"%{n.id}: {n.type_str} = {n.op}" + (f" {args}" if args else "")
                     + (f" {{{attrs}}}" if attrs else ""))
    for name, i in g.outputs.items():
        lines.append(f"output {name} = %{i}")
    for name, i in g.writebacks.items():
        lines.append(f"writeback {name} <- %{i}")
    return "\n".join(lines)
