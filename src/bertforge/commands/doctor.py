"""`bertforge doctor`: check this machine (versions, devices, attention kernels, a few timed training steps)."""

from __future__ import annotations

import argparse
import json

from bertforge.commands.common import add_command

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "doctor", help="check this machine: versions, devices, attention kernels, training speed",
        description="Report torch/CUDA/driver versions, the devices and their bf16 support, which attention "
                    "backends can run and which one `auto` picks for the preset's layers and why; check each "
                    "available backend's forward and backward against the eager reference in the chosen "
                    "precision; time a few training steps of a preset (tokens/s and MFU against the device's "
                    "peak: measured on a CPU, from a table of known GPUs, or --peak-tflops). Exits 1 if a "
                    "check fails.",
        example="""
        bertforge doctor
        bertforge doctor --preset bert-base --seq-len 128 --steps 20 --json > doctor.json
        """)
    # no `choices=`: listing the presets imports the models (torch), which every command's start-up would pay
    parser.add_argument("--preset", default=None,
                        help="model preset to time, e.g. bert-tiny, bert-mini, bert-base (default: bert-base on a "
                             "GPU, bert-tiny on a CPU)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence of the timed steps")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sequences per timed step (default: 32 on a GPU, 8 on a CPU)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps after one warm-up (default: 20 on a "
                                                                 "GPU, 3 on a CPU)")
    parser.add_argument("--device", default="auto", help="auto (a GPU if torch sees one), cpu, cuda or cuda:N")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="precision of the checks and timed steps (auto: bf16 on GPUs that have it, else fp32)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOP/s for MFU, instead of the measured / known value")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.doctor import default_preset, resolve_device, run_doctor
    from bertforge.errors import ConfigError
    from bertforge.models import preset_names

    if args.preset is not None and args.preset not in preset_names():
        raise ConfigError(f"--preset {args.preset} is not a model preset; choose one of {', '.join(preset_names())}")
    for name in ("seq_len", "batch_size", "steps", "peak_tflops"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} is {value}; it must be positive")
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    report = run_doctor(device, args.precision, args.preset or default_preset(device), args.seq_len,
                        args.batch_size or (32 if gpu else 8), args.steps or (20 if gpu else 3), args.peak_tflops)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report)
    return 0 if report.ok else 1


def load_sentence(load_average: float | None, cpu_cores: int | None) -> str:
    """The load the timing ran under, and whether other processes shared the cores."""
    if load_average is None:
        return "unknown (no load average on this system)"
    cores = f" on {cpu_cores} cores" if cpu_cores else ""
    busy = cpu_cores is not None and load_average > cpu_cores * 0.75
    verdict = ("busy: other processes shared the cores, so tokens/s is lower than on a quiet machine" if busy
               else "quiet enough for tokens/s to be representative")
    return f"load average {load_average:.2f} (1 min){cores}: {verdict}"


def print_report(report) -> None:  # type: ignore[no-untyped-def]
    from rich.markup import escape
    from rich.table import Table

    from bertforge.console import stdout_console

    machine = report.machine
    facts = Table(title="machine", show_header=False)
    gpus = "; ".join(f"{g['index']}: {g['name']}, {g['memory_gib']} GiB, sm {g['capability']}" for g in machine["gpus"])
    bf16 = machine["bf16"]
    for key, value in (("bertforge", machine["bertforge"]), ("python", machine["python"]), ("torch", machine["torch"]),
                       ("CUDA runtime", machine["cuda_runtime"] or "none (CPU build of torch)"),
                       ("NVIDIA driver", machine["cuda_driver"] or "none found"), ("GPUs", gpus or "none"),
                       ("CPU", f"{machine['cpu']}, {machine['cpu_threads']} torch threads"),
                       ("device", machine["device"]),
                       ("bf16", f"{'runs' if bf16['runs'] else 'no'}, {'native' if bf16['native'] else 'not native'}: "
                                f"{bf16['note']}")):
        facts.add_row(key, escape(str(value)))
    stdout_console.print(facts)

    attention = report.attention
    backends = Table(title=f"attention backends ({attention['precision']})")
    backends.add_column("backend")
    backends.add_column("runs here")
    for name, available in attention["available"].items():
        backends.add_row(name, "yes" if available else escape(f"no: {attention['unavailable_because'][name]}"))
    for choice in attention["auto"]:
        backends.add_row(f"auto, {choice['layers']} layers", escape(f"{choice['backend']}: {choice['reason']}"))
    stdout_console.print(backends)

    checks = Table(title="backends against eager fp32 (forward + backward, max error / max value)")
    for column in ("backend", "case", "max error", "tolerance", "result"):
        checks.add_column(column)
    for check in report.checks:
        checks.add_row(check.backend, check.case, f"{check.max_error:.2e}", f"{check.tolerance:.0e}",
                       "ok" if check.ok else "[bold red]FAILED[/]")
    stdout_console.print(checks)

    speed = report.training
    if speed is not None:
        timing = Table(title=f"training: {speed.preset}, {speed.batch_size} x {speed.seq_len} tokens, "
                             f"{speed.steps} timed steps", show_header=False)
        peak = escape(f"{speed.peak_tflops:.3g} TFLOP/s ({speed.peak_source})" if speed.peak_tflops else speed.peak_source)
        for key, value in (("tokens/s", f"{speed.tokens_per_second:,.0f}"),
                           ("model FLOPs/token", f"{speed.flops_per_token:.3g}"), ("peak", peak),
                           ("MFU", f"{speed.mfu:.1%}" if speed.mfu is not None else "unknown"),
                           ("last loss", f"{speed.final_loss:.3f}" + ("" if speed.ok else " [bold red]not finite[/]")),
                           ("machine load", escape(load_sentence(speed.load_average, speed.cpu_cores)))):
            timing.add_row(key, value)
        stdout_console.print(timing)
    stdout_console.print("all checks passed" if report.ok else "[bold red]a check failed[/]")
