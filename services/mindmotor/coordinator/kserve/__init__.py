"""The KServe v2 / Triton inference protocol on the coordinator's front door: health, server and
model metadata, model configuration, `infer` with JSON or binary tensors, and Triton's generate
extension (`/generate`, `/generate_stream`). Requests run the same path as `/v1/completions`."""
