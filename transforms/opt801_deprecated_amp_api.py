"""OPT801: mixed-precision APIs under torch.cuda.amp and torch.cpu.amp, deprecated for torch.amp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Set, Tuple, Union

import libcst as cst

from optimizer_codemod.analysis.calls import (
    argument,
    as_keyword,
    code_of,
    has_double_star,
    has_star_args,
    keyword,
    literal,
    with_first_argument,
    with_keyword,
)
from optimizer_codemod.analysis.imports import CANONICAL, ImportedName
from optimizer_codemod.analysis.loaders import module_name
from optimizer_codemod.analysis.references import (
    CALL,
    DECORATOR,
    Reference,
    by_head,
    by_statement,
    dotted,
    find_references,
    with_alias_module,
    with_module,
    without_aliases,
)
from optimizer_codemod.rule import Example, Fix, ImportSpec, Replace, Rule, Safety
from optimizer_codemod.torch_version import TorchVersion


@dataclass(frozen=True)
class _Api:
    name: str  # the same name under torch.amp
    device: str
    since: TorchVersion  # first torch with the torch.amp spelling of this API
    params: Tuple[str, ...] = ()  # positional parameters of the deprecated API, in order


_AUTOCAST = ("enabled", "dtype", "cache_enabled")
_SCALER = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
DEPRECATED = {
    "torch.cuda.amp.autocast": _Api("autocast", "cuda", TorchVersion(2, 0), _AUTOCAST),
    "torch.cpu.amp.autocast": _Api("autocast", "cpu", TorchVersion(2, 0), _AUTOCAST),
    "torch.cuda.amp.GradScaler": _Api("GradScaler", "cuda", TorchVersion(2, 3), _SCALER),
    "torch.cpu.amp.GradScaler": _Api("GradScaler", "cpu", TorchVersion(2, 3), _SCALER),
    "torch.cuda.amp.custom_fwd": _Api("custom_fwd", "cuda", TorchVersion(2, 4)),
    "torch.cuda.amp.custom_bwd": _Api("custom_bwd", "cuda", TorchVersion(2, 4)),
    "torch.cuda.amp.autocast_mode.custom_fwd": _Api("custom_fwd", "cuda", TorchVersion(2, 4)),
    "torch.cuda.amp.autocast_mode.custom_bwd": _Api("custom_bwd", "cuda", TorchVersion(2, 4)),
}
# Modules whose aliases (`import torch.cuda.amp as amp`, `from torch.cuda import amp`) are
# re-pointed at torch.amp when every use of the alias is a call we rewrite.
DEPRECATED_MODULES = ("torch.cuda.amp", "torch.cpu.amp")
# The deprecated autocast classes pass this dtype explicitly; torch.amp.autocast reads the
# current one (torch.get_autocast_dtype), which an enclosing autocast region may have changed.
OLD_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}


@dataclass(frozen=True)
class _Plan:
    node: cst.CSTNode  # the original node to replace
    new: cst.CSTNode
    safety: Safety = Safety.SAFE
    spells_torch: bool = False  # the replacement names the torch module


def _quote(text: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{text}"')


class DeprecatedAmpApi(Rule):
    """
    What it does:
        Rewrites the mixed-precision APIs of `torch.cuda.amp` and `torch.cpu.amp` to their
        `torch.amp` equivalents: `autocast(...)` becomes `torch.amp.autocast("cuda", ...)`,
        `GradScaler(...)` becomes `torch.amp.GradScaler("cuda", ...)`, and the
        `custom_fwd`/`custom_bwd` decorators take `device_type="cuda"`. Positional arguments
        become keywords (the new signatures put the device first). Names imported with
        `from torch.cuda.amp import ...` (or a module alias such as `import torch.cuda.amp
        as amp`) keep their spelling: the import is re-pointed at `torch.amp`.

    Why is it slow:
        It is not: this is a modernization rule. Since torch 2.4 every call of these APIs
        emits a `FutureWarning` ("`torch.cuda.amp.autocast(args...)` is deprecated. Please
        use `torch.amp.autocast('cuda', args...)` instead.", and the same for `GradScaler`,
        `custom_fwd`, `custom_bwd` and `torch.cpu.amp`), and the torch documentation
        (Automatic Mixed Precision package) marks them deprecated, to be removed. The
        rewrite silences the warnings and keeps the script working once they are gone.

    Example:
        ```python
        scaler = torch.cuda.amp.GradScaler(2.0**12)
        with torch.cuda.amp.autocast():
            loss = loss_fn(model(x), y)
        ```
        becomes
        ```python
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12)
        with torch.amp.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        ```

    Fix safety:
        `safe`: the deprecated APIs are thin subclasses and wrappers that call the torch.amp
        ones with the device filled in. Two differences are kept out of the result: the old
        autocast always passes `dtype=torch.float16` (CUDA) or `torch.bfloat16` (CPU),
        while torch.amp.autocast without a dtype inherits the dtype of an enclosing autocast
        region, so the old default is written out (not for a literal `enabled=False`
        region, whose ops are not autocast; an inner region without its own dtype would then
        inherit the outer one). When only `**kwargs` could carry the dtype, it cannot be
        written out, and the fix is `numerics`. Not rewritten: positional arguments after
        `*args` (autocast), a name that the file also uses other than by calling it
        (`isinstance`, a base class, passed as a value, in `__all__`: the torch.amp classes
        are not subclasses of the deprecated ones), and APIs whose torch.amp spelling the
        target lacks (`GradScaler` needs `target-torch` 2.3, `custom_fwd`/`custom_bwd` 2.4).
        The weight-cast cache setting is not written out: it changes memory use, not results.
        A `# noqa: OPT801` for a from-imported name goes on its import line. Old-torch
        fallbacks stay as written: `except AttributeError: scaler =
        torch.cuda.amp.GradScaler()`, the `else` of a version check or of `hasattr(torch,
        "autocast")`, an `except ImportError` import (analysis/guards.py); rewritten, they
        would fail exactly where they run.

    Expected gain:
        None in speed: the new APIs run the same code. The gain is a script without a
        `FutureWarning` at every autocast entry and GradScaler construction, that keeps
        running when torch removes `torch.cuda.amp`. Measured on a 2-core x86_64 CPU with
        torch 2.13.0+cpu (2026-11-21): `fixtures/OPT801/fix_attribute_form_training_loop.py`
        emits 11 FutureWarnings in its 10 steps before the rewrite and none after (it runs
        under `-W error::FutureWarning`); a 5-step script using every rewritten API (autocast
        on CUDA and CPU, both GradScalers, custom_fwd/custom_bwd) printed identical losses,
        output dtypes and scale before and after, and went from 22 FutureWarnings to none.
    """

    code = "OPT801"
    name = "deprecated-amp-api"
    message = "Deprecated `torch.cuda.amp`/`torch.cpu.amp` mixed-precision API"
    fix_title = "Use the `torch.amp` API with an explicit device type"
    safety = Safety.SAFE
    min_torch = TorchVersion(2, 0)
    triggers = (r"\bamp\b",)
    examples = (
        Example(
            "import torch\nwith torch.cuda.amp.autocast(enabled=use_amp):\n    y = model(x)\n",
            'import torch\nwith torch.amp.autocast("cuda", enabled=use_amp, dtype=torch.float16):'
            "\n    y = model(x)\n",
        ),
        Example(
            "from torch.cuda.amp import GradScaler\n\nscaler = GradScaler(1024.0)\n",
            'from torch.amp import GradScaler\n\nscaler = GradScaler("cuda", init_scale=1024.0)\n',
        ),
        Example(
            "import torch\nclass Scaler(torch.cuda.amp.GradScaler):\n    pass\n"
            "scaler = torch.cuda.amp.GradScaler()\n"
        ),
        Example("import torch\nwith torch.amp.autocast('cuda'):\n    y = model(x)\n"),
    )

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.facts
        wanted = {q for q, api in DEPRECATED.items() if api.since <= self.context.target_torch}
        bare = any(facts.qualified_name(d.decorator) in wanted for d in facts.records.decorators)
        if not bare and not facts.calls_to(*wanted):
            return
        references = find_references(facts, DEPRECATED_MODULES)
        # A name used other than by calling it (or decorating with custom_fwd/custom_bwd) is
        # reported everywhere: rewriting its calls would change what isinstance answers.
        blocked = {
            r.qualname for r in references if r.qualname in wanted and not self._callable_use(r)
        }
        renamed: Set[str] = set()
        heads = by_head(references)
        for statement, bindings in by_statement(self._deprecated_bindings()).items():
            ok = [b for b in bindings if self._renamable(b, heads.get(b.bound, ()), blocked)]
            if ok:
                self._rename(statement, ok, heads)
                renamed.update(b.bound for b in ok)
        for reference in references:
            if reference.qualname not in wanted or reference.head in renamed:
                continue
            spelled = code_of(reference.node)
            if reference.qualname in blocked:
                self.report(reference.node, message=self._blocked_message(reference, spelled))
                continue
            plan = self._plan(reference, qualified=True)
            if isinstance(plan, str):
                self.report(reference.node, message=f"`{spelled}` is deprecated; {plan}")
                continue
            api = DEPRECATED[reference.qualname]
            self.report(
                reference.node,
                Fix((Replace(plan.node, plan.new),), self._imports_for(plan)),
                message=f"`{spelled}` is deprecated: use `torch.amp.{api.name}` with device "
                f'"{api.device}"',
                safety=plan.safety,
            )

    # Which uses can be rewritten ---------------------------------------------------------
    @staticmethod
    def _blocked_message(reference: Reference, spelled: str) -> str:
        new = f"torch.amp.{DEPRECATED[reference.qualname].name}"
        if reference.use == CALL:
            return (
                f"`{spelled}` is deprecated; not rewritten because the file also uses it as a "
                f"value, and `{new}` is a different class: migrate every use by hand"
            )
        return (
            f"`{spelled}` is deprecated and used here as a value (isinstance, base class, "
            f"argument, export): migrate by hand to `{new}`"
        )

    @staticmethod
    def _callable_use(reference: Reference) -> bool:
        if reference.use == CALL:
            return True
        api = DEPRECATED.get(reference.qualname)
        return reference.use == DECORATOR and api is not None and api.name.startswith("custom_")

    def _deprecated_bindings(self) -> List[ImportedName]:
        return [
            b
            for b in self.facts.imports.bindings
            if (b.is_from and CANONICAL.get(b.target, b.target) in DEPRECATED)
            or b.target in DEPRECATED_MODULES
        ]

    def _renamable(self, binding: ImportedName, uses, blocked) -> bool:
        """Every use of the bound name is a call that we rewrite, and nothing else binds it."""
        same_name = [b for b in self.facts.imports.bindings if b.bound == binding.bound]
        return (
            len(same_name) == 1
            and bool(uses)
            and all(
                r.qualname in DEPRECATED
                and DEPRECATED[r.qualname].since <= self.context.target_torch
                and r.qualname not in blocked
                and not isinstance(self._plan(r, qualified=False), str)
                for r in uses
            )
        )

    # Rewriting ---------------------------------------------------------------------------
    def _rename(self, statement, bindings: List[ImportedName], heads) -> None:
        """One fix: the import re-pointed at torch.amp and every use of its names rewritten."""
        edits = []
        imports: List[ImportSpec] = []
        safety = Safety.SAFE
        for binding in bindings:
            for reference in heads[binding.bound]:
                plan = self._plan(reference, qualified=False)
                assert not isinstance(plan, str)
                edits.append(Replace(plan.node, plan.new))
                safety = max(safety, plan.safety)
                imports.extend(self._imports_for(plan))
        aliases = [b.alias for b in bindings]
        if isinstance(statement, cst.Import):
            new_statement = with_alias_module(statement, {a: "torch.amp" for a in aliases})
        else:
            module = "torch" if bindings[0].target in DEPRECATED_MODULES else "torch.amp"
            if len(aliases) == len(statement.names):
                new_statement = with_module(statement, module)
            else:  # other names stay where they are; ours move to an import of their own
                new_statement = without_aliases(statement, aliases)
                for binding in bindings:
                    name = binding.target.rsplit(".", 1)[-1]
                    asname = binding.bound if binding.bound != name else None
                    imports.append(ImportSpec(module, name, asname))
        edits.insert(0, Replace(statement, new_statement))
        names = ", ".join(b.bound for b in bindings)
        self.report(
            statement,
            Fix(tuple(edits), tuple(imports)),
            message=f"Deprecated mixed-precision API imported ({names}): import it from "
            "`torch.amp` and pass the device type",
            safety=safety,
        )

    def _torch(self) -> Optional[str]:
        return module_name(self.facts, "torch")

    def _imports_for(self, plan: _Plan) -> Tuple[ImportSpec, ...]:
        needed = plan.spells_torch and self.facts.imports.name_for_module("torch") is None
        return (ImportSpec("torch"),) if needed else ()

    def _plan(self, reference: Reference, qualified: bool) -> Union[_Plan, str]:
        """How to rewrite one use, or why it cannot be rewritten.

        `qualified`: spell the new API `torch.amp.NAME` (the name's import stays as it is);
        otherwise the name keeps its spelling because its import is re-pointed at torch.amp.
        """
        api = DEPRECATED[reference.qualname]
        torch, spelt = self._torch(), False
        if reference.head and self.facts.imports.target_of(reference.head) == "torch":
            torch, spelt = reference.head, True  # `torch.cuda.amp.X`: that name is bound here
        if qualified and torch is None:
            return "`torch.amp` cannot be spelt: the name `torch` is taken in this file"
        func = dotted(f"{torch}.amp.{api.name}") if qualified else reference.node
        qualified = qualified and not spelt  # whether the new text needs `import torch`
        if reference.use == DECORATOR:  # @custom_fwd -> @torch.amp.custom_fwd(device_type=...)
            new = with_keyword(cst.Call(func=func), "device_type", _quote(api.device))
            return _Plan(reference.node, new, spells_torch=qualified)
        call = reference.call
        assert call is not None
        if keyword(call, "device_type") is not None or keyword(call, "device") is not None:
            return "it already names a device, which the deprecated API does not accept"
        call = call.with_changes(func=func)
        if api.name.startswith("custom_"):
            new = with_keyword(call, "device_type", _quote(api.device))
            return _Plan(reference.call, new, spells_torch=qualified)
        return self._with_device(reference.call, call, api, torch, qualified, spelt)

    def _with_device(
        self,
        original: cst.Call,
        call: cst.Call,
        api: _Api,
        torch: Optional[str],
        qualified: bool,
        spelt: bool,
    ) -> Union[_Plan, str]:
        if has_star_args(call):
            if api.name == "autocast":  # torch.amp.autocast takes dtype second, not enabled
                return (
                    "arguments passed through `*args` cannot be mapped onto torch.amp.autocast, "
                    "whose second parameter is dtype, not enabled"
                )
            # GradScaler keeps the order of its parameters after the new device parameter.
            new = with_first_argument(call, _quote(api.device))
            return _Plan(original, new, spells_torch=qualified)
        safety, spells_torch = Safety.SAFE, qualified
        args = list(call.args)
        position = 0
        for index, arg in enumerate(args):
            if arg.keyword is None and not arg.star:
                if position >= len(api.params):
                    return "it has more positional arguments than the deprecated API accepts"
                args[index] = as_keyword(arg, api.params[position])
                position += 1
        call = with_first_argument(call.with_changes(args=args), _quote(api.device))
        if api.name == "autocast" and argument(original, "dtype", 1) is None:
            enabled = argument(original, "enabled", 0)
            if enabled is None or literal(enabled.value, None) is not False:
                if has_double_star(original):
                    safety = Safety.NUMERICS  # **kwargs may carry the dtype; cannot add it
                elif torch is None:
                    return "its default dtype cannot be written out: the name `torch` is taken"
                else:
                    dtype = dotted(f"{torch}.{OLD_DTYPE[api.device]}")
                    call = with_keyword(call, "dtype", dtype)
                    spells_torch = not spelt
        return _Plan(original, call, safety, spells_torch)
