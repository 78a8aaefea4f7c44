"""Property tests: the engine on generated programs, with every rule and unsafe fixes on.

For any program hypothesmith generates, and for generated programs with training-script
snippets spliced in (so the rules actually fire), the engine either refuses the input with one
of its documented errors (not Python, or not reproducible by LibCST) or returns an output that
compiles, keeps every comment and every statement it did not edit, and that a second run leaves
unchanged. The checks are the corpus run's (scripts/corpus_run.py), so both agree on what a
failure is.
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path
from typing import List

import hypothesmith
import libcst as cst
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from invariants import assert_comments_kept, assert_untouched_statements_kept
from optimizer_codemod.engine import RewriteOptions
from optimizer_codemod.torch_version import TorchVersion

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import corpus_run  # noqa: E402

OPTIONS = corpus_run.corpus_options(unsafe_fixes=True)
ALLOWED = (corpus_run.PARSED, corpus_run.REFUSED)

# Generated programs call literals and the like; compile() warns about them.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

# Deterministic (CI reruns see the same programs) and no example database on disk.
COMMON = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def compiles(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<generated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def libcst_reproduces(src: bytes) -> bool:
    try:
        return cst.parse_module(src).bytes == src
    except Exception:  # LibCST does not parse every valid program (or recurses too deep)
        return False


def check(source: str, options: RewriteOptions = OPTIONS) -> corpus_run.Checked:
    """Every promise the engine makes about one text; returns what it did for more checks."""
    src = source.encode("utf-8")
    checked = corpus_run.check_text(src, "generated.py", options)
    report = checked.report
    assert report.kind in ALLOWED, f"{report.kind}: {report.error}\n--- input ---\n{source}"
    assert report.not_compiling is None, f"{report.not_compiling}\n--- input ---\n{source}"
    assert report.not_idempotent is None, f"{report.not_idempotent}\n--- input ---\n{source}"
    if report.kind == corpus_run.REFUSED:
        # A documented refusal is only for text Python rejects or LibCST cannot reproduce.
        assert (
            not compiles(source) or not libcst_reproduces(src) or "nested" in str(report.error)
        ), f"valid, reproducible input refused: {report.error}\n--- input ---\n{source}"
    elif checked.new != src:
        after = checked.new.decode("utf-8")
        assert_comments_kept(source, after)
        assert_untouched_statements_kept(source, after, checked.diagnostics)
    return checked


# --- Programs hypothesmith generates -----------------------------------------------------


@settings(max_examples=100, **COMMON)
@given(hypothesmith.from_grammar())
def test_programs_from_the_grammar(source: str) -> None:
    check(source)


@settings(max_examples=40, **COMMON)
@given(hypothesmith.from_node())
def test_programs_from_libcst_nodes(source: str) -> None:
    check(source)


# --- Generated programs with training-script snippets spliced in ------------------------

HEADERS = (
    "import torch\n",
    "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n",
    "import torch\nfrom torch import optim\nfrom torch.utils.data import DataLoader, TensorDataset\n",
    "import torch as T\nfrom torch.utils import data\n",
    "from torch.optim import AdamW, SGD\nfrom torch.cuda.amp import autocast, GradScaler\n",
    "",  # no imports at all: rules must not fire on names they cannot resolve
)

SNIPPETS = (
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
    "device = 'cuda'\n",
    "model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())\n",
    "model = nn.Linear(16, 4).to(device)\n",
    "model = model.cuda()\n",
    "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)\n",
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n",
    "optimizer = optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)  # adam\n",
    "opt = AdamW(params, **config)\n",
    "opt = T.optim.Adagrad(model.parameters(), foreach=True)\n",
    "optimizer = torch.optim.RMSprop(model.parameters())\n",
    "optimizer = torch.optim.AdamW(model.parameters())  # noqa: OPT501\n",
    "dataset = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))\n",
    "loader = DataLoader(dataset, batch_size=32, shuffle=True)\n",
    "loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=0)\n",
    "loader = data.DataLoader(dataset, 16, True, num_workers=4)\n",
    "loader = DataLoader(dataset, **loader_kwargs)\n",
    "scaler = torch.cuda.amp.GradScaler()\n",
    "scaler = GradScaler(enabled=True)\n",
    "torch.backends.cudnn.benchmark = False\n",
    "torch.backends.cuda.matmul.allow_tf32 = False\n",
    "x = x.to(device)\n",
    "x, y = x.cuda(), y.cuda()\n",
    "x = x.to(device, non_blocking=True)\n",
    "optimizer.zero_grad(set_to_none=False)\n",
    "optimizer.zero_grad()\n",
    "model.zero_grad(set_to_none=False)\n",
    "with torch.cuda.amp.autocast():\n    loss = model(x).sum()\n",
    "with autocast(dtype=torch.float16):\n    out = model(x)\n",
    "with torch.backends.cuda.sdp_kernel(enable_flash=False):\n    out = model(x)\n",
    "loss.backward()\n",
    "scaler.scale(loss).backward()\n",
    "optimizer.step()\n",
    "print(loss.item())\n",
    "torch.save(model.state_dict(), 'model.pt')\n",
    "y = x.clone()\n",
    "model.eval()\nwith torch.no_grad():\n    pred = model(x.to(device))\n",
    "if __name__ == '__main__':\n    main()\n",
)

TRAINING_LOOP = """\
for epoch in range(3):
    model.train()
    for step, (x, y) in enumerate(loader):
        x = x.to(device)
        y = y.to(device)
        optimizer.zero_grad(set_to_none=False)
        with torch.cuda.amp.autocast():
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(epoch, loss.item())
"""

WRAPPERS = (
    ("", ""),
    ("def main():\n", "    "),
    ("def train(model, loader, device):\n", "    "),
    ("for epoch in range(10):\n", "    "),
    ("for epoch in range(10):\n    for x, y in loader:\n", "        "),
    ("if __name__ == '__main__':\n", "    "),
    ("with torch.no_grad():\n", "    "),
    ("class Trainer:\n    def fit(self):\n", "        "),
)


def _indent(code: str, prefix: str) -> str:
    return textwrap.indent(code, prefix) if prefix else code


# Generated statements that go between the snippets: small programs from the grammar, and
# single statements from LibCST nodes (which are more varied in layout).
# Targeting is off: it may record one observation per test case, and a program draws many.
generated_chunks = st.one_of(
    hypothesmith.from_grammar(auto_target=False).filter(lambda s: "__future__" not in s),
    hypothesmith.from_node(cst.SimpleStatementLine, auto_target=False),
)


@st.composite
def training_programs(draw) -> str:
    parts: List[str] = [draw(st.sampled_from(HEADERS))]
    blocks = draw(
        st.lists(
            st.one_of(
                st.sampled_from(SNIPPETS),
                st.sampled_from(SNIPPETS),  # weighted: most blocks are snippets
                st.just(TRAINING_LOOP),
                generated_chunks,
            ),
            min_size=1,
            max_size=8,
        )
    )
    opening, prefix = draw(st.sampled_from(WRAPPERS))
    body = []
    for block in blocks:
        block = block if block.endswith("\n") or not block else block + "\n"
        body.append(block)
    text = "".join(body)
    if opening and text.strip():
        parts.append(opening + _indent(text, prefix))
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from(SNIPPETS)))
    else:
        parts.append(text)
    source = "".join(parts)
    assume(compiles(source))
    return source


def _target(text: str) -> TorchVersion:
    return TorchVersion.parse(text)


option_sets = st.builds(
    lambda unsafe, target: RewriteOptions(
        rules=OPTIONS.rules, unsafe_fixes=unsafe, target_torch=target
    ),
    st.booleans(),
    st.sampled_from([_target("2.0"), _target("2.4"), OPTIONS.target_torch]),
)


@settings(max_examples=100, **COMMON)
@given(training_programs(), option_sets)
@example(
    "import torch\nfrom torch.utils.data import DataLoader\n"
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    "model = torch.nn.Linear(16, 4).to(device)\n"
    "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)\n"
    "loader = DataLoader(dataset, batch_size=32, shuffle=True)\n" + TRAINING_LOOP,
    OPTIONS,
)
def test_training_snippets_in_generated_programs(source: str, options: RewriteOptions) -> None:
    check(source, options)


# A whole training script, one (indent, line) per line: a program drops some lines and gets
# generated statements inserted between the others, at the indentation of the next line.
SCRIPT = [
    (0, "import torch"),
    (0, "import torch.nn as nn"),
    (0, "from torch.utils.data import DataLoader, TensorDataset"),
    (0, "torch.backends.cudnn.benchmark = False"),
    (0, "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')"),
    (0, "dataset = TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,)))"),
    (0, "loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)"),
    (0, "model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(4))"),
    (0, "model = model.to(device)"),
    (0, "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the optimizer"),
    (0, "scaler = torch.cuda.amp.GradScaler()"),
    (0, "for epoch in range(2):"),
    (1, "model.train()"),
    (1, "for x, y in loader:"),
    (2, "x = x.to(device)"),
    (2, "y = y.cuda()"),
    (2, "optimizer.zero_grad(set_to_none=False)"),
    (2, "with torch.cuda.amp.autocast():"),
    (3, "loss = nn.functional.cross_entropy(model(x), y)"),
    (2, "scaler.scale(loss).backward()"),
    (2, "scaler.step(optimizer)"),
    (2, "scaler.update()"),
    (1, "print(epoch, loss.item())"),
    (0, "torch.save(model.state_dict(), 'model.pt')"),
]


@st.composite
def training_scripts(draw) -> str:
    places = st.integers(0, len(SCRIPT) - 1)
    inserts = draw(st.dictionaries(places, generated_chunks, max_size=3))
    # Compound statements' headers stay, so that their bodies keep a home.
    dropped = draw(st.sets(places.filter(lambda i: not SCRIPT[i][1].endswith(":")), max_size=4))
    lines: List[str] = []
    for index, (depth, line) in enumerate(SCRIPT):
        if index in inserts:  # generated code before this line, at its indentation
            lines.append(_indent(inserts[index].rstrip("\n") + "\n", "    " * depth))
        if index not in dropped:
            lines.append("    " * depth + line + "\n")
    source = "".join(lines)
    assume(compiles(source))
    return source


@settings(max_examples=100, **COMMON)
@given(training_scripts(), option_sets)
def test_generated_code_in_a_training_script(source: str, options: RewriteOptions) -> None:
    check(source, options)


def test_snippet_programs_make_rules_fire() -> None:
    """The splicing strategy is only useful if rules change what it generates."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "model = torch.nn.Linear(16, 4).to(device)\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)\n"
        "loader = DataLoader(dataset, batch_size=32, shuffle=True)\n" + TRAINING_LOOP
    )
    checked = check(source)
    fixed = {d.code for d in checked.diagnostics if d.status.value == "fixed"}
    assert checked.report.changed and len(fixed) >= 2, fixed


@pytest.mark.parametrize(
    "source",
    [
        "",
        "\n",
        "#",
        "\ufeffimport torch\n",
        "import torch\r\nopt = torch.optim.AdamW(m.parameters())\r\n",
        "if True:\n\tx = 1\n",
        "x = (\n  1)  # comment\n",
        "import torch\nopt = torch.optim.SGD(p, lr=0.1); opt.zero_grad(set_to_none=False)\n",
        "def f(:\n",
        "x = 1\n  # indented comment before a whitespace-only last line\n   ",
    ],
)
def test_edge_cases(source: str) -> None:
    check(source)


# --- Deep and long expressions -------------------------------------------------------------
# LibCST's parser crashes the process on an expression a few thousand levels deep and its
# visitors run out of recursion far sooner; the engine measures nesting before parsing
# (optimizer_codemod/nesting.py). Generated expressions of every shape that nests, at sizes
# around the limits, must come back rewritten or refused with a clear error, and the measure
# must bound the real tree's depth whenever the text is parsed.

# Each shape wraps an inner expression (`{}`) in n more levels.
NESTING_SHAPES = {
    "binary chain": lambda n, inner: " + ".join([inner] + ["a"] * n),
    "mixed operators": lambda n, inner: inner
    + "".join(f" {'+-*/%|&^'[i % 8]} a{i % 7}" for i in range(n)),
    "power chain": lambda n, inner: "**".join(["a"] * n + [f"({inner})"]),
    "boolean chain": lambda n, inner: " or ".join(["a"] * n + [f"({inner})"]),
    "comparison chain": lambda n, inner: " < ".join([f"({inner})"] + ["a"] * n),
    "unary minus": lambda n, inner: "-" * n + f"({inner})",
    "not": lambda n, inner: "not " * n + f"({inner})",
    "calls": lambda n, inner: f"({inner})" + "(x)" * n,
    "subscripts": lambda n, inner: f"({inner})" + "[0]" * n,
    "attributes": lambda n, inner: f"({inner})" + ".b" * n,
    "nested calls": lambda n, inner: "f(" * n + inner + ")" * n,
    "nested lists": lambda n, inner: "[" * n + inner + "]" * n,
    "nested dicts": lambda n, inner: "{1: " * n + inner + "}" * n,
    "nested subscripts": lambda n, inner: "a[" * n + inner + "]" * n,
    "nested tuples": lambda n, inner: "(a, " * n + inner + ")" * n,
    "string concatenation": lambda n, inner: "'s' " * n + f"str({inner})",
    "f-string": lambda n, inner: "f'{" + " + ".join([f"({inner})"] + ["a"] * n) + "}'",
    # PEP 701 (Python 3.12): quotes reused inside a replacement field, f-strings in f-strings.
    "nested f-strings": lambda n, inner: "f'{" * n + f"({inner})" + "}'" * n,
    "f-string reusing its quotes": lambda n, inner: "f'{x['k'] + "
    + " + ".join([f"({inner})"] + ["a"] * n)
    + "}'",
    "conditional": lambda n, inner: "a if b else " * n + f"({inner})",
    "lambdas": lambda n, inner: "lambda: " * n + f"({inner})",
    "generators": lambda n, inner: "(x for x in " * n + inner + ")" * n,
}
# Small; around the depth where Python's default recursion limit used to give out (~300);
# around the limit (a bound of 1000 is 250 to 1000 levels, by shape); far beyond it.
NESTING_SIZES = st.one_of(
    st.integers(1, 60),
    st.integers(100, 350),
    st.integers(250, 1000),
    st.integers(2000, 12000),
)


@st.composite
def deep_programs(draw) -> str:
    expression = "a"
    for _ in range(draw(st.integers(1, 2))):
        shape = draw(st.sampled_from(sorted(NESTING_SHAPES)))
        expression = NESTING_SHAPES[shape](draw(NESTING_SIZES), expression)
    statement = f"z = {expression}\n"
    wrapping = draw(st.sampled_from(["none", "blocks", "elifs"]))
    if wrapping == "blocks":  # CPython allows 100 levels of indentation
        depth = draw(st.integers(1, 99))
        lines = [" " * i + f"if c{i}:" for i in range(depth)]
        statement = "\n".join(lines) + "\n" + " " * depth + statement
    elif wrapping == "elifs":
        count = draw(st.one_of(st.integers(1, 50), st.integers(300, 1500)))
        chain = "".join(f"elif c == {i}:\n    pass\n" for i in range(count))
        statement = "if c:\n    pass\n" + chain + "else:\n    " + statement
    return "import torch\noptimizer = torch.optim.AdamW(model.parameters())\n" + statement


def _python_rejects(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<generated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    return False


def _tree_depth(module: cst.Module) -> int:
    deepest, stack = 0, [(module, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.children)
    return deepest


@settings(max_examples=100, **COMMON)
@given(deep_programs())
# Found by a longer run: brackets inside an f-string's field nest two nodes per level.
@example("z = f'{(" + "[" * 300 + "a" + "]" * 300 + ") + a}'\n")
def test_deep_and_long_expressions(source: str) -> None:
    from optimizer_codemod import nesting

    src = source.encode("utf-8")
    report = corpus_run.check_text(src, "deep.py", OPTIONS).report
    assert report.kind in ALLOWED, f"{report.kind}: {report.error}"
    assert report.not_compiling is None and report.not_idempotent is None
    bound, brackets = nesting.estimate(src)
    within = bound <= nesting.MAX_NESTING and brackets <= nesting.PYTHON_MAX_BRACKETS
    event(f"{report.kind}, bound {'<= 300' if bound <= 300 else '<= 1000' if within else '> 1000'}")
    if report.kind == corpus_run.REFUSED:
        assert "too deeply nested" in report.error or "cannot parse" in report.error
        # Refused only beyond the limits, or when Python itself rejects the text.
        assert not within or _python_rejects(source), report.error
    else:
        assert within
        # Safe to parse here: within the limit. The bound must hold for the real tree.
        assert _tree_depth(cst.parse_module(src)) <= bound
