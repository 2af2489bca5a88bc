"""Plant known bugs in the op semantics and check that the test suite catches each one.

    python3 scripts/mutations.py            # all mutations
    python3 scripts/mutations.py M1 M8      # some
    python3 scripts/mutations.py -j 2 M18-M61   # a range, two at a time

Each mutation is one text replacement in one file of pkg/webgrad. It is applied to a copy
of pkg/ and tests/ in a temporary directory (the checkout is never touched), then the tests
named beside it run there; the mutation is *caught* when they fail. The run ends with a
table, and a non-zero exit status if any mutation survived or no longer applies (the text
it replaces changed: update it here). docs/reliability-mutations.md lists the results.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# id, what it breaks, file under pkg/webgrad, old text, new text, pytest arguments
MUTATIONS = [
    ("M1", "max_last gradient to the first maximum only (torch.max's rule, not amax's)",
     "primitives/reduce.py",
     "    return [O.unsqueeze(g, -1) * hit / O.sum_last(hit, keepdims=True)]",
     "    return [O.unsqueeze(g, -1) * O.one_hot(O.argmax_last(i[0]), i[0].shape[-1])]",
     ["tests/test_ops.py", "-k", "max and reference"]),
    ("M2", "max_last gradient to every tied maximum, undivided",
     "primitives/reduce.py",
     "    return [O.unsqueeze(g, -1) * hit / O.sum_last(hit, keepdims=True)]",
     "    return [O.unsqueeze(g, -1) * hit]",
     ["tests/test_ops.py", "-k", "max and reference"]),
    ("M3", "maximum/minimum ties: the first operand takes the whole gradient",
     "primitives/elementwise.py",
     "        m = win + 0.5 * O.equal(i[0], i[1])",
     "        m = win + 1.0 * O.equal(i[0], i[1])",
     ["tests/test_ops.py", "-k", "imum and reference"]),
    ("M4", "max_pool2d through max (ties share the gradient; torch routes it to one)",
     "ops.py",
     "    out = sum_last(where(one_hot(at, kh * kw), cols, 0.0))",
     "    out = max_last(cols)",
     ["tests/test_ops.py", "-k", "max_pool2d and reference"]),
    ("M5", "mean divides by n + 1",
     "ops.py",
     "def mean_last(x, *, keepdims=False): return sum_last(x, keepdims=keepdims) * (1.0 / x.shape[-1])",
     "def mean_last(x, *, keepdims=False): return sum_last(x, keepdims=keepdims) * (1.0 / (x.shape[-1] + 1))",
     ["tests/test_ops.py", "-k", "mean and reference"]),
    ("M6", "sum's gradient broadcast along the wrong axes (kept axes as 1)",
     "primitives/reduce.py",
     "    keep = tuple(1 if k in a[\"axes\"] else d for k, d in enumerate(x.shape))",
     "    keep = tuple(d if k in a[\"axes\"] else 1 for k, d in enumerate(x.shape))",
     ["tests/test_ops.py", "-k", "sum and reference"]),
    ("M7", "WGSL max reductions ignore NaN (plain max)",
     "codegen/reduce.py",
     "    return f\"select(select(max({a}, {b}), {b}, isnan_f({b})), {a}, isnan_f({a}))\"",
     "    return f\"max({a}, {b})\"",
     ["tests/test_webgpu.py", "-k", "test_oracle and special"]),
    ("M8", "WGSL split reductions drop the last partial",
     "codegen/reduce.py",
     "    with em.block(f\"for (var p = 0u; p < {P}u; p++)\"):",
     "    with em.block(f\"for (var p = 0u; p + 1u < {P}u; p++)\"):",
     ["tests/test_semantics.py", "-k", "i32_sums and webgpu"]),
    ("M9", "WGSL argmax keeps the last maximum of a row",
     "codegen/reduce.py",
     "        with em.block(f\"if ({v} > {acc} || (isnan_f({v}) && !isnan_f({acc})))\"):",
     "        with em.block(f\"if ({v} >= {acc} || (isnan_f({v}) && !isnan_f({acc})))\"):",
     ["tests/test_webgpu.py", "-k", "test_oracle and argmax"]),
    ("M10", "less_equal as 1 - greater (1 for NaN)",
     "ops.py",
     "def less_equal(a, b): return less(a, b) + equal(a, b)",
     "def less_equal(a, b): return 1.0 - greater(a, b)",
     ["tests/test_ops.py", "-k", "less_equal and reference"]),
    ("M11", "`<=` bound to less",
     "tensor.py",
     "    def __le__(self, o): return _ops().less_equal(self, o)",
     "    def __le__(self, o): return _ops().less(self, o)",
     ["tests/test_ops.py", "tests/test_semantics.py", "-k", "operator and reference"]),
    ("M12", "WGSL greater as >=",
     "codegen/elementwise.py",
     "    \"greater\": lambda x, y: f\"select(0.0f, 1.0f, {x} > {y})\",",
     "    \"greater\": lambda x, y: f\"select(0.0f, 1.0f, {x} >= {y})\",",
     ["tests/test_webgpu.py", "-k", "test_oracle and greater"]),
    ("M13", "WGSL relu drops NaN (max(x, 0))",
     "codegen/elementwise.py",
     "    \"relu\": lambda x, a: f\"select(max({x}, 0.0f), {x}, isnan_f({x}))\",",
     "    \"relu\": lambda x, a: f\"max({x}, 0.0f)\",",
     ["tests/test_webgpu.py", "-k", "test_oracle and relu"]),
    ("M14", "fed indices not range-checked",
     "bounds.py",
     "        if lo >= 0 and hi < b.n:\n            continue",
     "        if True:\n            continue",
     ["tests/test_semantics.py", "-k", "out_of_range and reference"]),
    ("M15", "WGSL gather wraps negative rows again",
     "codegen/index.py",
     "    ok = em.let(f\"{r} >= 0i && {r} < {rows}i\")\n    row = em.let(f\"u32(clamp({r}, 0i, {max(rows - 1, 0)}i))\")",
     "    ok = \"true\"\n    row = em.let(f\"u32(select({r}, {r} + {rows}i, {r} < 0i))\")",
     ["tests/test_webgpu.py", "-k", "test_oracle and computed_out_of_range"]),
    ("M16", "scatter_add_rows ranks a position within its row counting itself (<=)",
     "codegen/index.py",
     "            em.emit(f\"rank += select(0u, 1u, {gl}[q2] < j);\")",
     "            em.emit(f\"rank += select(0u, 1u, {gl}[q2] <= j);\")",
     ["tests/test_semantics.py", "-k", "50k and webgpu"]),
    ("M17", "sign(NaN) = NaN in the reference (numpy's rule, not torch's)",
     "primitives/elementwise.py",
     "_unary(\"sign\", ELEMENT, lambda np, a, x: np.where(np.isnan(x), np.zeros_like(x), np.sign(x)), None)",
     "_unary(\"sign\", ELEMENT, lambda np, a, x: np.sign(x), None)",
     ["tests/test_ops.py", "-k", "sign and reference"]),

    # ---- optimizers and schedules (tests/test_optim.py: 20 steps against torch.optim)
    ("M18", "Adam without the bias correction of m (lr, not lr / (1 - b1^t))",
     "optim.py",
     "        step_size = lr / bc1\n",
     "        step_size = lr\n",
     ["tests/test_optim.py", "-k", "matches_torch and adam and reference"]),
    ("M19", "Adam divides by 1 - b2^t instead of its square root",
     "optim.py",
     "        inv_sqrt_bc2 = ops.rsqrt(bc2)",
     "        inv_sqrt_bc2 = 1.0 / bc2",
     ["tests/test_optim.py", "-k", "matches_torch and adam and reference"]),
    ("M20", "Adam's eps inside the square root",
     "optim.py",
     "(ops.sqrt(v2) * inv_sqrt_bc2 + self.eps)",
     "ops.sqrt(v2 * inv_sqrt_bc2 * inv_sqrt_bc2 + self.eps)",
     ["tests/test_optim.py", "-k", "matches_torch and adam and reference"]),
    ("M21", "AdamW's weight decay coupled (added to the gradient, Adam's L2 form)",
     "optim.py",
     "    decoupled = True\n",
     "    decoupled = False\n",
     ["tests/test_optim.py", "-k", "matches_torch and adamw and reference"]),
    ("M22", "Adam decays every parameter, also biases and norms (decay=False ignored)",
     "optim.py",
     "            wd = self.weight_decay if p.decays else 0.0",
     "            wd = self.weight_decay",
     ["tests/test_optim.py", "-k", "matches_torch and adam_l2 and reference"]),
    ("M23", "SGD momentum damps the first step too (torch starts the buffer at g)",
     "optim.py",
     "                    b2 = ops.where(ops.equal(ctx.step, 0.0), g, b2)",
     "                    b2 = b2",
     ["tests/test_optim.py", "-k", "matches_torch and sgd_dampening and reference"]),
    ("M24", "SGD Nesterov looks ahead with the old momentum buffer",
     "optim.py",
     "                g = g + self.momentum * b2 if self.nesterov else b2",
     "                g = g + self.momentum * buf if self.nesterov else b2",
     ["tests/test_optim.py", "-k", "matches_torch and sgd_nesterov and reference"]),
    ("M25", "gradient clipping by the squared norm (no square root)",
     "optim.py",
     "max_norm / (ops.sqrt(total) + 1e-6)",
     "max_norm / (total + 1e-6)",
     ["tests/test_optim.py", "-k", "matches_torch and clip and reference"]),
    ("M26", "warmup one step late (peak t / steps, not (t + 1) / steps)",
     "lr.py",
     "(t + 1.0) * (self.peak / self.steps)",
     "t * (self.peak / self.steps)",
     ["tests/test_optim.py", "-k", "schedule_matches_torch and warmup and reference"]),

    # ---- gradient rules (tests/test_ops.py: the oracle against torch autograd)
    ("M27", "pow's dx unguarded where y = 0 (0 * 0^-1 = NaN at a zero base)",
     "primitives/elementwise.py",
     "    dx = O.where(O.equal(y, 0.0), 0.0, g * y * O.pow(x, y - 1.0))",
     "    dx = g * y * O.pow(x, y - 1.0)",
     ["tests/test_ops.py", "-k", "zero_base_grads and reference"]),
    ("M28", "pow's dy guard only for y > 0 (0^0 log 0 = NaN)",
     "primitives/elementwise.py",
     "O.equal(x, 0.0) * O.greater_equal(y, 0.0)",
     "O.equal(x, 0.0) * O.greater(y, 0.0)",
     ["tests/test_ops.py", "-k", "zero_base_grads and reference"]),
    ("M29", "div's gradient to the divisor with the wrong sign",
     "primitives/elementwise.py",
     "[g / i[1], -g * o / i[1]]",
     "[g / i[1], g * o / i[1]]",
     ["tests/test_ops.py", "-k", "test_oracle and div/ and reference"]),
    ("M30", "erf's derivative 1/sqrt(pi) e^-x^2 (half of 2/sqrt(pi))",
     "primitives/elementwise.py",
     "g * (2 / math.sqrt(math.pi)) * _O().exp(-(i[0] * i[0]))",
     "g * (1 / math.sqrt(math.pi)) * _O().exp(-(i[0] * i[0]))",
     ["tests/test_ops.py", "-k", "test_oracle and erf and reference"]),
    ("M31", "softmax backward subtracts sum(g), not sum(g * y)",
     "primitives/reduce.py",
     "    return [o * (g - O.sum_last(g * o, keepdims=True))]",
     "    return [o * (g - O.sum_last(g, keepdims=True))]",
     ["tests/test_ops.py", "-k", "test_oracle and softmax_last and reference"]),
    ("M32", "log_softmax backward scales sum(g) by the log-probabilities, not softmax",
     "primitives/reduce.py",
     "    return [g - O.exp(o) * O.sum_last(g, keepdims=True)]",
     "    return [g - o * O.sum_last(g, keepdims=True)]",
     ["tests/test_ops.py", "-k", "test_oracle and log_softmax and reference"]),
    ("M33", "layer norm backward without the xhat * mean(g * xhat) term",
     "primitives/reduce.py",
     "    return [r * (g - O.mean_last(g, keepdims=True) - o * O.mean_last(g * o, keepdims=True))]",
     "    return [r * (g - O.mean_last(g, keepdims=True))]",
     ["tests/test_ops.py", "-k", "test_oracle and layer_norm and reference"]),
    ("M34", "where's gradient routed to the wrong branches",
     "primitives/elementwise.py",
     "[None, _O().where(i[0], g, 0.0), _O().where(i[0], 0.0, g)]",
     "[None, _O().where(i[0], 0.0, g), _O().where(i[0], g, 0.0)]",
     ["tests/test_ops.py", "-k", "test_oracle and where and reference"]),

    # ---- tokenizers (tests/test_bpe.py against transformers' GPT2Tokenizer,
    #      tests/test_tokenizer.py against tokenizers on Llama 2/3 and Qwen3 files)
    ("M35", "BPE merges the highest-ranked pair first",
     "models/merges.py",
     "                r = min(ranks)",
     "                r = max((x for x in ranks if x != none), default=none)",
     ["tests/test_bpe.py", "-k", "test_cases"]),
    ("M36", "BPE merges equal-ranked pairs rightmost first",
     "models/merges.py",
     "                i = ranks.index(r)",
     "                i = len(ranks) - 1 - ranks[::-1].index(r)",
     ["tests/test_bpe.py", "-k", "test_cases"]),
    ("M37", "BPE merge loop does not look up the pair a merge makes with its left neighbour",
     "models/merges.py",
     "                    ranks[i - 1] = get(chunk[i - 1] << _SHIFT | new, none)",
     "                    ranks[i - 1] = none",
     ["tests/test_bpe.py", "-k", "test_cases"]),
    ("M38", "BPE bucket loop lets a rank finish before a lower-ranked pair on its left",
     "models/merges.py",
     "                    if r3 < r:",
     "                    if False:",
     ["tests/test_tokenizer.py", "-k", "merge_order"]),
    ("M39", "GPT-2 contractions matched case-insensitively (Llama 3's rule)",
     "models/bpe.py",
     '_CONTRACTIONS = r"\'(?:s|t|re|ve|m|ll|d)"',
     '_CONTRACTIONS = r"(?i:\'(?:s|t|re|ve|m|ll|d))"',
     ["tests/test_bpe.py", "-k", "test_cases"]),
    ("M40", "GPT-2 pre-tokenizer splits digits in groups of three (Llama 3's rule)",
     "models/bpe.py",
     "| ?{number}+|",
     "| ?{number}{{1,3}}|",
     ["tests/test_bpe.py", "-k", "test_cases"]),
    ("M41", "GPT-2 decode drops a character cut between tokens instead of U+FFFD",
     "models/bpe.py",
     'return self.decode_bytes(ids).decode("utf-8", errors="replace")',
     'return self.decode_bytes(ids).decode("utf-8", errors="ignore")',
     ["tests/test_bpe.py", "-k", "partial"]),
    ("M42", "byte fallback off: characters outside the vocabulary become <unk>",
     "models/tokenizer.py",
     'for b in ch.encode("utf-8")] if self.byte_fallback else [None]',
     'for b in ch.encode("utf-8")] if False else [None]',
     ["tests/test_tokenizer.py", "-k", "test_cases and llama2"]),
    ("M43", "ByteFallback decode: an invalid byte run as Python's U+FFFD per bad sequence",
     "models/tokenizer.py",
     '                out.extend("\\ufffd" * len(run))',
     '                out.append(bytes(run).decode("utf-8", "replace"))',
     ["tests/test_tokenizer.py", "-k", "partial and llama2"]),
    ("M44", "added tokens matched shortest first (tokenizers matches the longest)",
     "models/tokenizer.py",
     "            for content in sorted(contents, key=len, reverse=True):",
     "            for content in sorted(contents, key=len):",
     ["tests/test_tokenizer.py", "-k", "added_tokens"]),

    # ---- dequantizers (tests/test_gguf.py: numpy and pure Python against gguf.quants;
    #      WGSL on lavapipe: tests/test_gguf_gpu.py, tests/test_gguf_quant.py)
    ("M45", "Q8_0 scale read big-endian (numpy)",
     "quants/q8_0.py",
     '    d = blocks[:, :2].copy().view("<f2").astype(np.float32)',
     '    d = blocks[:, :2].copy().view(">f2").astype(np.float32)',
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q8_0 and numpy"]),
    ("M46", "Q8_0 quants read unsigned (pure Python)",
     "quants/q8_0.py",
     'struct.unpack("<32b", raw[o + 2:o + 34])',
     'struct.unpack("<32B", raw[o + 2:o + 34])',
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q8_0 and pure"]),
    ("M47", "Q4_0 low nibbles without the offset 8 (pure Python)",
     "quants/q4_0.py",
     "out.extend([d * ((q & 15) - 8) for q in qs])",
     "out.extend([d * (q & 15) for q in qs])",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q4_0 and pure"]),
    ("M48", "Q4_K mins 4-7 take their top bits from the scale bytes (numpy)",
     "quants/q4_k.py",
     "(s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)",
     "(s[:, 8:12] >> 4) | ((s[:, 0:4] >> 6) << 4)",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q4_K and numpy"]),
    ("M49", "Q4_K scales 4-7 from the high nibbles of bytes 8-11 (pure Python)",
     "quants/q4_k.py",
     "[(s[j + 8] & 15) | ((s[j] >> 6) << 4) for j in range(4)]",
     "[(s[j + 8] >> 4) | ((s[j] >> 6) << 4) for j in range(4)]",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q4_K and pure"]),
    ("M50", "Q5_K fifth bit read from bit sub / 2 of qh (pure Python)",
     "quants/q5_k.py",
     "(((h >> sub) & 1) << 4)",
     "(((h >> (sub // 2)) & 1) << 4)",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q5_K and pure"]),
    ("M51", "Q6_K offset 32 subtracted in unsigned bytes (wraps; numpy)",
     "quants/q6_k.py",
     ".astype(np.int8) - np.int8(32)",
     ".astype(np.uint8) - np.uint8(32)",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q6_K and numpy"]),
    ("M52", "Q6_K one scale per 32 values, not per 16 (pure Python)",
     "quants/q6_k.py",
     "s0, s1 = d * sc[8 * h + 2 * t], d * sc[8 * h + 2 * t + 1]",
     "s0 = s1 = d * sc[8 * h + 2 * t]",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q6_K and pure"]),
    ("M53", "Q6_K scales read unsigned (numpy)",
     "quants/q6_k.py",
     "blocks[:, 192:208].view(np.int8)",
     "blocks[:, 192:208]",
     ["tests/test_gguf.py", "-k", "dequantize_equals_gguf and Q6_K and numpy"]),
    ("M54", "WGSL Q4_0 element decoder without the offset 8",
     "quants/q4_0.py",
     "  return select(s.x, s.y, (b & 1u) == 1u) * f32(i32(q) - 8i);",
     "  return select(s.x, s.y, (b & 1u) == 1u) * f32(q);",
     ["tests/test_gguf_gpu.py", "-k", "dequantization_equals_gguf and Q4_0"]),
    ("M55", "WGSL Q5_K element decoder reads the fifth bit from bit sub / 2",
     "quants/q5_k.py",
     "(((w & 3u) << 3u) + sub)) & 1u)",
     "(((w & 3u) << 3u) + (sub >> 1u))) & 1u)",
     ["tests/test_gguf_gpu.py", "-k", "dequantization_equals_gguf and Q5_K"]),
    ("M56", "WGSL Q6_K group decoder (matmul) without the offset 32 on a word's last byte",
     "quants/q6_k.py",
     "f32(i32(v >> 24u) - 32i));",
     "f32(i32(v >> 24u)));",
     ["tests/test_gguf_quant.py", "-k", "matmul_and_gather and Q6_K and webgpu"]),

    # ---- the attention mask (tests/test_attention.py reads what the matcher found;
    #      tests/test_webgpu.py runs the fused kernels against torch)
    ("M57", "matcher reads a strict mask (j < i + 1) one key too wide",
     "codegen/attention_pattern.py",
     "        off = (math.ceil(t) - 1) if strict else math.floor(t)",
     "        off = math.ceil(t) if strict else math.floor(t)",
     ["tests/test_attention.py", "-k", "spellings or left_alone"]),
    ("M58", "matcher accepts a mild fill (-10) as a mask",
     "codegen/attention_pattern.py",
     "not (fill is not None and fill <= MASK_FILL)",
     "not (fill is not None and fill < 0)",
     ["tests/test_attention.py", "-k", "spellings or left_alone"]),
    ("M59", "matcher reads where's branches the wrong way round (mask direction)",
     "codegen/attention_pattern.py",
     '(lambda x: x != 0) if keeps == "nonzero" else (lambda x: x == 0)',
     '(lambda x: x == 0) if keeps == "nonzero" else (lambda x: x != 0)',
     ["tests/test_attention.py", "-k", "spellings or left_alone"]),
    ("M60", "matcher reads a divided scale as a multiplied one",
     "codegen/attention_pattern.py",
     '                f = c if node.op == "mul" else 1.0 / c',
     "                f = c",
     ["tests/test_attention.py", "-k", "spellings or left_alone"]),
    ("M61", "WGSL row kernels keep keys j < i + offset (one too few)",
     "codegen/attention.py",
     'f"min(r + {off + 1}u, {S}u)"',
     'f"min(r + {off}u, {S}u)"',
     ["tests/test_webgpu.py", "-k", "test_oracle and attention/cache_block"]),
    ("M62", "BPE bucket loop merges equal-ranked pairs rightmost first",
     "models/merges.py",
     "                fresh.sort()",
     "                fresh.sort(reverse=True)",
     ["tests/test_tokenizer.py", "-k", "merge_order"]),
    ("M63", "long words cut where only a merge of two two-symbol parts joins",
     "models/merges.py",
     "                        or t[i - 1:i + 3] in both2)]",
     "                        or False)]",
     ["tests/test_tokenizer.py", "-k", "random_merge"]),
    ("M64", "long words cut wherever no merge of two single symbols joins",
     "models/merges.py",
     '_IS_CUT = bytes.maketrans(b"\\0\\1\\2", b"\\0\\0\\1")',
     '_IS_CUT = bytes.maketrans(b"\\0\\1\\2", b"\\0\\1\\1")',
     ["tests/test_tokenizer.py", "-k", "random_merge"]),
]


def run(mutation) -> tuple[str, str]:
    mid, what, rel, old, new, args = mutation
    with tempfile.TemporaryDirectory(prefix=f"webgrad-{mid}-") as tmp:
        tmp = Path(tmp)
        for part in ("pkg", "tests"):
            shutil.copytree(ROOT / part, tmp / part, ignore=shutil.ignore_patterns("__pycache__"))
        for extra in ("pyproject.toml", "pytest.ini", "setup.cfg"):
            if (ROOT / extra).exists():
                shutil.copy(ROOT / extra, tmp / extra)
        if (ROOT / ".cache").exists():   # the tokenizer files tests/*_files.py find there
            (tmp / ".cache").symlink_to(ROOT / ".cache", target_is_directory=True)
        target = tmp / "pkg" / "webgrad" / rel
        text = target.read_text()
        if text.count(old) != 1:
            return "STALE", f"the text to replace occurs {text.count(old)} times in {rel}"
        target.write_text(text.replace(old, new))
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               *args], cwd=tmp, capture_output=True, text=True, timeout=900)
        last = (done.stdout.strip().splitlines() or ["?"])[-1] + f" [{time.monotonic() - start:.0f} s]"
        if done.returncode == 1:
            return "caught", last
        if done.returncode == 0:
            return "SURVIVED", last
        return "ERROR", last + "\n" + done.stderr[-2000:]


def choose(argv) -> tuple[list, int]:
    """The mutations named in argv (ids or ranges such as M18-M26; none: all) and -j N."""
    jobs, names = 1, []
    it = iter(argv)
    for a in it:
        if a == "-j":
            jobs = int(next(it))
        elif a.startswith("-j"):
            jobs = int(a[2:])
        elif "-" in a:
            lo, hi = (int(x.lstrip("M")) for x in a.split("-"))
            names += [f"M{k}" for k in range(lo, hi + 1)]
        else:
            names.append(a)
    return [m for m in MUTATIONS if not names or m[0] in names], jobs


def main(argv) -> int:
    chosen, jobs = choose(argv)
    bad = 0
    start = time.monotonic()
    with ThreadPoolExecutor(jobs) as pool:   # each run is a subprocess: threads suffice
        for m, (status, detail) in zip(chosen, pool.map(run, chosen)):
            bad += status != "caught"
            print(f"{m[0]:4} {status:8} {m[1]}\n     {' '.join(m[5])}: {detail}", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} caught in {time.monotonic() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
