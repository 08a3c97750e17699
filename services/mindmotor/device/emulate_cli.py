"""`mindmotor emulate step`: what one engine step would cost on an emulated card, operator by
operator — "what would this cost on a 910B3?".

    mindmotor emulate step --device 910B3 --model qwen2-7b --decode 64x2048 --prefill 512:1024
    mindmotor emulate step --device H100-SXM --model path/to/config.json --tp 2 --decode 8x512 --json

`--decode BxK`: B decoding sequences, each with K tokens of context (repeatable); `--prefill C[:P]`:
a prefill chunk of C new tokens after P cached ones (repeatable). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("emulate", help="price steps on an emulated card")
    sub = parser.add_subparsers(dest="emulate_command", metavar="SUBCOMMAND")
    step = sub.add_parser("step", help="one step's time and per-operator breakdown")
    step.add_argument("--device", default="910B3", help="emulated device (default 910B3)")
    step.add_argument("--model", required=True,
                      help="a model profile name (qwen2-7b, llama2-7b, ...) or a Hugging Face config.json")
    step.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    step.add_argument("--decode", action="append", default=[], metavar="BxK",
                      help="B decoding sequences with K tokens of context each (repeatable)")
    step.add_argument("--prefill", action="append", default=[], metavar="C[:P]",
                      help="a prefill chunk of C new tokens after P cached ones (repeatable)")
    step.add_argument("--dtype", default="bf16", help="compute dtype for peak FLOP/s (default bf16)")
    step.add_argument("--elementwise", choices=("fused", "unfused"), default=None,
                      help="override the device's elementwise-kernel fusion (MindIE/ATB fused, vLLM unfused)")
    step.add_argument("--json", action="store_true", help='one JSON object {"seconds", "operators"}')
    step.set_defaults(func=run_step)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    return value


def parse_decode(text: str) -> list[int]:
    b, sep, k = text.lower().partition("x")
    if not sep:
        raise ValueError(f"--decode wants BxK (e.g. 64x2048), got {text!r}")
    batch, context = _positive(b, "--decode B"), _positive(k, "--decode K")
    if context < 1:
        raise ValueError("--decode K (the context) must be at least 1")
    return [context] * batch


def parse_prefill(text: str) -> tuple[int, int]:
    c, _, p = text.partition(":")
    new = _positive(c, "--prefill C")
    if new < 1:
        raise ValueError("--prefill C (the new tokens) must be at least 1")
    return new, _positive(p, "--prefill P") if p else 0


def price(device: str, model: str, tp: int, decodes: list[str], prefills: list[str],
          dtype: str = "bf16", elementwise: str | None = None) -> dict:
    from mindmotor.device.cost_model import OPERATOR_NAMES, CostModel, StepShape
    from mindmotor.device.hf_profile import resolve_profile
    from mindmotor.device.specs import get_device_spec

    if tp < 1:
        raise ValueError(f"--tp must be at least 1, got {tp}")
    shape = StepShape(prefills=[parse_prefill(p) for p in prefills],
                      decodes=[k for d in decodes for k in parse_decode(d)])
    if shape.num_tokens == 0:
        raise ValueError("the step is empty: give --decode BxK and/or --prefill C[:P]")
    fused = None if elementwise is None else elementwise == "fused"
    model_ = CostModel(get_device_spec(device), resolve_profile(model, tp), dtype=dtype,
                       fused_elementwise=fused)
    cost = model_.step(shape)
    ops = {name: cost.breakdown[name] for name in OPERATOR_NAMES if name in cost.breakdown}
    return {"seconds": cost.seconds, "operators": ops, "device": model_.spec.name,
            "model": model_.profile.name, "tp": tp, "tokens": shape.num_tokens,
            "compute_bound": cost.compute_bound}


def run_step(args: argparse.Namespace) -> int:
    try:
        result = price(args.device, args.model, args.tp, args.decode, args.prefill, args.dtype,
                       args.elementwise)
    except ValueError as exc:
        print(f"emulate step: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"seconds": result["seconds"], "operators": result["operators"]}))
        return 0
    total = result["seconds"]
    print(f"{result['model']} (tp {result['tp']}) on {result['device']}: {result['tokens']} tokens, "
          f"{total * 1e3:.3f} ms ({'compute' if result['compute_bound'] else 'memory'}-bound)")
    for name, seconds in result["operators"].items():
        print(f"  {name:<18} {seconds * 1e3:>10.3f} ms  {seconds / total * 100:5.1f}%")
    return 0
