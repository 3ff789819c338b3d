"""The trainer client against the real `mxq serve` (issue 21): `Client(url).update_weights(state_dict)` from the
default model's own master weights sends anchors, then sparse deltas; the server's checksums match the client's
after each update, and A -> B -> A serves A's tokens again bit for bit."""
import ml_dtypes
import numpy as np

np.bfloat16 = ml_dtypes.bfloat16  # note: safetensors' numpy backend looks bf16 up on numpy itself
from safetensors.numpy import load_file  # noqa: E402

from mxq_client import Client, MxqError  # noqa: E402
from serve_fixtures import DEFAULT_MODEL  # noqa: E402

PROMPT = list(range(300, 340))


def master_weights():
    sd = {}
    for f in sorted(DEFAULT_MODEL.glob("*.safetensors")):
        sd.update(load_file(f))
    return sd


def greedy(c):
    r = c.completions(PROMPT, max_tokens=12, temperature=0, return_token_ids=True)
    return r["choices"][0]["token_ids"]


def test_update_weights_round_trip_through_the_server(serve_factory):
    s = serve_factory("--model", DEFAULT_MODEL, "--quantization", "mxfp8")
    c = Client(s.base_url)
    a = master_weights()
    before = greedy(c)
    assert c.weight_version() == 0

    c.update_weights(a)  # the first call: every tensor an anchor; the same weights
    assert c.weight_version() == 1 and c.last_update["anchors"] == len(c.tensor_table())
    assert greedy(c) == before

    b = dict(a)
    name = "model.layers.1.mlp.down_proj.weight"
    w = a[name].astype(np.float32)
    rng = np.random.default_rng(0)
    hit = rng.random(w.shape) < 0.01  # an RL step's worth: 1% of one tensor's elements move
    w[hit] *= 4.0
    b[name] = w.astype(a[name].dtype)
    c.update_weights(b)  # sparse: a few entries of one tensor
    assert c.weight_version() == 2 and c.last_update["anchors"] == 0
    assert c.last_update["sparse"] == len(c.tensor_table())
    # note: a moved block max requantizes its whole 1x32 block: ~13% of the bytes here, not 1%
    assert 0 < c.last_update["applied_bytes"] < w.size // 4, c.last_update

    c.update_weights(a)  # back to A: A's tokens again
    assert c.weight_version() == 3 and greedy(c) == before


def test_a_refused_update_raises_with_the_servers_reason(serve_factory):
    s = serve_factory("--model", DEFAULT_MODEL, "--quantization", "mxfp8")
    c = Client(s.base_url)
    a = master_weights()
    bad = dict(a)
    name = "model.layers.0.self_attn.q_proj.weight"
    w = a[name].astype(np.float32)
    w[0, 0] = np.nan
    bad[name] = w.astype(a[name].dtype)
    try:
        c.update_weights(bad)
        raise AssertionError("a NaN weight was sent")
    except (MxqError, ValueError) as e:
        assert name in str(e), str(e)
    assert c.weight_version() == 0
