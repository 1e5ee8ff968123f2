"""The Tinker SDK's binary messages: the forward/backward request it sends as protobuf, and the two results it
accepts only as protobuf (`ForwardBackwardOutput`, `SampleResponse`).

The SDK's own generated messages (`tinker.proto.tinker_public_pb2`) read and write them, so both sides speak
one version of the format; what this module adds is the layout the SDK's encoder and decoder agree on
(`tinker/proto/request_conv.py`, `response_conv.py`): token ids as int32 bytes, tensors dense or sparse CSR,
per-datum outputs batched into one buffer with byte offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from hone.errors import HoneError

_DTYPES: dict[int, Any] = {
    pb.DTYPE_FLOAT32: np.float32,
    pb.DTYPE_INT64: np.int64,
    pb.DTYPE_INT32: np.int32,
}
_STOP_REASONS = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
PROTO = "application/x-protobuf"


class WireError(HoneError, ValueError):
    """A request the server cannot read (or asks for what it does not serve): one line, a 400 or a failed
    future with category `user`."""


@dataclass
class Datum:
    """One training example: the model's input tokens and its loss inputs (`target_tokens`, `weights`, ...),
    each a dense array whose first axis runs along the tokens."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackward:
    """A `/api/v1/forward_backward` request, decoded."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def read_forward_backward(body: bytes, content_encoding: str | None) -> ForwardBackward:
    """Decode the SDK's protobuf `ForwardBackwardRequest` (zstd-compressed when the client config asks)."""
    if content_encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
    elif content_encoding not in (None, "", "identity"):
        raise WireError(f"forward_backward: unsupported Content-Encoding {content_encoding!r}")
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # the protobuf runtime's DecodeError
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest message ({e})") from e
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # newer clients: v2 wins (it can hold text)
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = [_datum(d, i) for i, d in enumerate(msg.data)]
    return ForwardBackward(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def _datum(msg: Any, index: int) -> Datum:
    tokens: list[int] = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"datum {index}: {kind} input chunks are not supported (text tokens only)")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    return Datum(tokens, {name: tensor(t, f"datum {index} {name}") for name, t in msg.loss_fn_inputs.items()})


def tensor(msg: Any, what: str) -> np.ndarray:
    """A protobuf `Tensor` as a dense numpy array (a sparse CSR one is expanded: the SDK sparsifies 2-D
    `target_tokens` and `weights` on its own)."""
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"{what}: unsupported tensor dtype {msg.dtype}")
    shape = list(msg.shape)
    if msg.WhichOneof("encoding") == "sparse_csr":
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        rows = np.frombuffer(csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(csr.col_indices, dtype=np.int64)
        dense = np.zeros(shape, dtype=dtype)
        row_of = np.repeat(np.arange(len(rows) - 1), np.diff(rows))
        dense[row_of, cols] = values
        return dense
    flat = np.frombuffer(msg.dense, dtype=dtype)
    return flat.reshape(shape) if shape else flat


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """`ForwardBackwardOutput` with one `ArrayRecord`: each field's per-datum arrays (float32, first axis
    along the tokens) concatenated, with byte offsets; the SDK slices them back into `TensorData`."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in outputs[0] if outputs else []:
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs]
        sizes = [a.nbytes for a in arrays]
        field_msg = record.fields[name]
        field_msg.dtype = pb.DTYPE_FLOAT32
        field_msg.data = b"".join(a.tobytes() for a in arrays)
        field_msg.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tobytes()
        field_msg.trailing_shape.extend(arrays[0].shape[1:])
    return bytes(msg.SerializeToString())


@dataclass
class Sequence:
    """One sampled continuation."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


def sample_response(sequences: list[Sequence], prompt_logprobs: np.ndarray | None) -> bytes:
    """`SampleResponse`: token ids as int32 bytes, log-probs as float32 bytes, the prompt's log-probs (NaN
    where none is defined: the first token) when asked."""
    msg = pb.SampleResponse()
    for seq in sequences:
        msg.sequences.add(
            stop_reason=_STOP_REASONS[seq.stop_reason],
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return bytes(msg.SerializeToString())
