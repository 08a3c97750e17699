"""Between the wire (worker.proto) and the engine's types. Pure functions, no I/O."""

from __future__ import annotations

import dataclasses

from mindmotor.vocabulary import FinishReason
from mindmotor.engine.continuation import Continuation, KVSource
from mindmotor.rules.constraint import Constraint
from mindmotor.engine.output import RequestOutput
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.protocol import worker_pb2 as pb


def prompt_from_request(request: pb.GenerateRequest) -> str | list[int]:
    """The prompt text or token ids; ValueError when the request carries neither."""
    kind = request.WhichOneof("prompt")
    if kind == "prompt_text":
        return request.prompt_text
    if kind == "prompt_token_ids":
        return list(request.prompt_token_ids.ids)
    raise ValueError("the request has no prompt: set prompt_text or prompt_token_ids")


def continuation_from_request(request: pb.GenerateRequest) -> Continuation | None:
    """The request's continuation, if it is one (the engine checks the tokens and `sent_chars`);
    ValueError for a KV source without an address or handle."""
    if not request.HasField("continuation"):
        return None
    c = request.continuation
    source = None
    if c.HasField("kv_source"):
        k = c.kv_source
        if not k.address or not k.handle:
            raise ValueError("a continuation's kv_source needs the address and handle of the pinned KV")
        source = KVSource(address=k.address, handle=k.handle, node=k.node, cached_tokens=k.cached_tokens)
    return Continuation(tuple(c.output_token_ids), c.sent_chars, source)


def sampling_params_from_proto(p: pb.SamplingParams) -> SamplingParams:
    """Unset optional fields keep the engine's defaults, except max_tokens: unset means up to the
    model's context (the caller applies its API's default). ValueError (the engine's message)
    for out-of-range values."""
    optional = {name: getattr(p, name) for name in ("temperature", "top_p", "seed", "logprobs",
                                                     "repetition_penalty", "prompt_logprobs",
                                                     "skip_special_tokens")
                if p.HasField(name)}
    return SamplingParams(
        max_tokens=p.max_tokens if p.HasField("max_tokens") else None, top_k=p.top_k, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos, min_tokens=p.min_tokens, presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty, include_stop_str_in_output=p.include_stop_str_in_output,
        min_p=p.min_p, logit_bias=dict(p.logit_bias),
        allowed_token_ids=list(p.allowed_token_ids) if p.allowed_token_ids else None,
        bad_words=list(p.bad_words),
        structured=Constraint(p.structured.kind, p.structured.spec) if p.HasField("structured") else None,
        **optional)


def request_timings(out: RequestOutput, started: float, last_token_at: float) -> pb.RequestTimings:
    """The phases of a finished call (`RequestTimings`): `started`, the Generate call's start, and
    `last_token_at`, when its last output came, on the engine's clock (time.monotonic). A request
    that never ran (failed while queued) spent it all queued."""
    end = max(last_token_at, started)
    scheduled = out.first_scheduled_time
    if scheduled is None:
        return pb.RequestTimings(queued_s=end - started, preemptions=out.num_preemptions)
    scheduled = min(max(scheduled, started), end)
    first = end if out.first_token_time is None else min(max(out.first_token_time, scheduled), end)
    return pb.RequestTimings(queued_s=scheduled - started, prefill_s=first - scheduled, decode_s=end - first,
                             preemptions=out.num_preemptions)


def response_from_output(out: RequestOutput, timings: pb.RequestTimings | None = None) -> pb.GenerateResponse:
    response = pb.GenerateResponse(
        request_id=out.request_id, token_ids=out.new_token_ids, text=out.new_text,
        logprobs=[_token_logprob(lp) for lp in out.new_logprobs],
        prompt_logprobs=[_token_logprob(lp) for lp in out.prompt_logprobs or ()])
    if not out.finished:
        return response
    response.finish_reason = out.finish_reason or ""
    if isinstance(out.stop_reason, str):
        response.stop_string = out.stop_reason
    elif out.stop_reason is not None:
        response.stop_token_id = int(out.stop_reason)
    response.usage.CopyFrom(pb.Usage(prompt_tokens=out.num_prompt_tokens,
                                     completion_tokens=out.num_output_tokens,
                                     cached_tokens=out.num_cached_tokens))
    if timings is not None:
        response.timings.CopyFrom(timings)
    return response


def response_from_outputs(outs: list[RequestOutput], timings: pb.RequestTimings | None = None
                          ) -> pb.GenerateResponse:
    """One response for a whole call (GenerateUnary): the outputs' tokens, text and logprobs in
    order, the first one's prompt logprobs, the last one's finish, usage and `timings`."""
    if len(outs) == 1:
        return response_from_output(outs[0], timings)
    last = outs[-1]
    whole = dataclasses.replace(
        last, new_token_ids=[t for o in outs for t in o.new_token_ids], new_text="".join(o.new_text for o in outs),
        new_logprobs=[lp for o in outs for lp in o.new_logprobs],
        prompt_logprobs=next((o.prompt_logprobs for o in outs if o.prompt_logprobs), None))
    return response_from_output(whole, timings)


def prefill_response(out: RequestOutput, prompt_token_ids: list[int], node: str, block_size: int
                     ) -> pb.PrefillResponse:
    """The first token of a prefill-only request; a handle when its KV is pinned (it continues on a
    decode instance), else the finish reason (the first token already ended it)."""
    pinned = out.finish_reason == FinishReason.PREFILLED
    response = pb.PrefillResponse(
        handle=out.request_id if pinned else "", token_ids=out.new_token_ids, text=out.new_text,
        logprobs=[_token_logprob(lp) for lp in out.new_logprobs],
        prompt_logprobs=[_token_logprob(lp) for lp in out.prompt_logprobs or ()],
        finish_reason="" if pinned else (out.finish_reason or ""),
        usage=pb.Usage(prompt_tokens=out.num_prompt_tokens, completion_tokens=out.num_output_tokens,
                       cached_tokens=out.num_cached_tokens),
        prompt_token_ids=prompt_token_ids, node=node, block_size=block_size,
        num_blocks=-(-len(prompt_token_ids) // block_size) if pinned else 0)
    if isinstance(out.stop_reason, str):
        response.stop_string = out.stop_reason
    elif out.stop_reason is not None:
        response.stop_token_id = int(out.stop_reason)
    return response


def _token_logprob(lp) -> pb.TokenLogprob:
    out = pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob,
                          top=[pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top])
    if lp.rank is not None:
        out.rank = lp.rank
    return out


def load_from_stats(stats, in_flight: int) -> pb.Load:
    return pb.Load(
        running=stats.num_running, waiting=stats.num_waiting, in_flight=in_flight,
        kv_usage=stats.kv_usage, num_blocks=stats.num_blocks, num_free_blocks=stats.num_free_blocks,
        prefix_hit_rate=stats.prefix_hit_rate, num_preemptions=stats.num_preemptions,
        prompt_tokens=stats.prompt_tokens, generation_tokens=stats.generation_tokens, steps=stats.steps,
        emulated_time_s=stats.emulated_time_s, host_time_s=stats.host_time_s,
        lag_time_s=stats.lag_time_s, kv_pinned=stats.num_pinned, kv_transfers=stats.kv_transfers,
        kv_transfer_s=stats.kv_transfer_s,
        iteration_token_counts=list(stats.iteration_tokens.counts) if stats.iteration_tokens else [],
        iteration_tokens_sum=stats.iteration_tokens.total if stats.iteration_tokens else 0.0)


def device_status_from_snapshot(snap: dict) -> pb.DeviceStatus:
    return pb.DeviceStatus(
        device=str(snap.get("device", "")), npu_id=int(snap.get("npu_id", 0)),
        utilization=float(snap.get("utilization", 0.0)), hbm_used_bytes=int(snap.get("hbm_used_bytes", 0)),
        hbm_total_bytes=int(snap.get("hbm_total_bytes", 0)), power_w=float(snap.get("power_w", 0.0)),
        temperature_c=float(snap.get("temperature_c", 0.0)),
        aicore_freq_mhz=int(snap.get("aicore_freq_mhz") or 0), health=str(snap.get("health", "")))
