"""llama.cpp's flags that mean nothing in strata, each answered with one line saying what strata does
instead, before click parses (else `-ngl 99` would read as `-n gl`).

The rule: a flag that asks for a placement, a size or a mode that strata sets with a flag of its
own is refused (exit 2; the line names that flag), since ignoring it could run something else
than was asked (`-ngl 0`); a flag whose request strata always meets, or that changes nothing in
what runs, is ignored with a warning."""

from __future__ import annotations

from dataclasses import dataclass

import click


@dataclass(frozen=True)
class LlamaFlag:
    names: tuple[str, ...]
    takes: str  # "value", "flag", or "optional": a value only when the next word is one of OPTIONAL_VALUES
    refuse: bool
    instead: str


OPTIONAL_VALUES = ("on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled")

_EXPERTS = ("strata keeps every expert in host memory and streams those a token needs into the device's expert "
            "cache: size it with --expert-cache SIZE (e.g. 14GiB; auto takes what the GPU has free)")
FLAGS: tuple[LlamaFlag, ...] = (
    LlamaFlag(("-ngl", "--n-gpu-layers", "--gpu-layers"), "value", True,
              "strata has no layers to offload: the dense weights and the KV cache all stay on the device "
              "and the experts stream through the expert cache; pick the device with --device cuda|cpu and the "
              "cache with --expert-cache SIZE"),
    LlamaFlag(("-ncmoe", "--n-cpu-moe"), "value", True, _EXPERTS),
    LlamaFlag(("-cmoe", "--cpu-moe"), "flag", True, _EXPERTS),
    LlamaFlag(("-ot", "--override-tensor"), "value", True,
              "strata places tensors itself (dense weights on the device, experts through the expert cache): "
              "use --expert-cache SIZE and --source host|mmap"),
    LlamaFlag(("-b", "--batch-size", "-ub", "--ubatch-size"), "value", True,
              "strata runs the prompt in chunks of --prefill N tokens (or --prefill auto[:MAX], the largest "
              "chunk the expert cache leaves room for)"),
    LlamaFlag(("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"), "value", True,
              "strata's KV cache type is one flag for keys and values: --kv-type f16|f32"),
    LlamaFlag(("--no-mmap",), "flag", True,
              "strata reads experts from a copy in RAM with --source host, or from the mapped file with "
              "--source mmap"),
    LlamaFlag(("-cnv", "--conversation"), "flag", True, "for a conversation run 'strata chat MODEL'"),
    LlamaFlag(("-fa", "--flash-attn"), "optional", False,
              "strata's attention is always fused (scores never stored), so there is nothing to switch"),
    LlamaFlag(("--mlock",), "flag", False,
              "with --source host on a GPU the experts' host copy is page-locked already; otherwise nothing is locked"),
)
_BY_NAME = {n: f for f in FLAGS for n in f.names}


def _value_options(command: click.Command) -> set[str]:
    """The command's own options that take a value: the word after one of them is never a flag."""
    out: set[str] = set()
    for p in command.params:
        if isinstance(p, click.Option) and not p.is_flag and not p.count:
            out.update(p.opts)
            out.update(p.secondary_opts)
    return out


def strip_llama_flags(ctx: click.Context, args: list[str]) -> list[str]:
    """`args` without llama.cpp's flags (and their values): refuses (UsageError) or warns on each."""
    values = _value_options(ctx.command)
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        name, eq, _ = a.partition("=") if a.startswith("-") else (a, "", "")
        flag = _BY_NAME.get(name)
        if flag is None or name in values:
            out.append(a)
            if a in values:  # its value, whatever it looks like
                out += args[i + 1:i + 2]
                i += 1
            i += 1
            continue
        shown = a
        if not eq and flag.takes == "value" and i + 1 < len(args):
            shown = f"{a} {args[i + 1]}"
            i += 1
        elif not eq and flag.takes == "optional" and i + 1 < len(args) and args[i + 1].lower() in OPTIONAL_VALUES:
            shown = f"{a} {args[i + 1]}"
            i += 1
        i += 1
        if flag.refuse:
            raise click.UsageError(f"{shown} is a llama.cpp flag: {flag.instead}", ctx)
        click.echo(f"strata: warning: ignoring the llama.cpp flag {shown}: {flag.instead}", err=True)
    return out


class Command(click.Command):
    """A strata command: llama.cpp's flags answered first (see strip_llama_flags)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, strip_llama_flags(ctx, args))
