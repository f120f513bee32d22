"""Serving on Ray Serve (chroma/serve.py): the safetensors codec, request validation, and a
real local Ray instance: HTTP requests of several batch sizes in JSON and safetensors, bad
requests answered 4xx while the replica keeps serving, the Python handle, concurrent clients
merged by Ray Serve's batching, a replica killed mid-traffic (restarted by Ray; the handle's
calls retried; none lost or wrong), and a two-node cluster on this machine
(ray.cluster_utils.Cluster) with a replica on each node.

Reference: the same artifact loaded in this process (chroma.load), whose rows are checked
against eager PyTorch in test_batching.py; answers must equal it exactly (JSON carries
float32 values as float64 decimals, which round-trip exactly).

Ray's usage reporting is off (chroma.serve sets RAY_USAGE_STATS_ENABLED=0) and everything
listens on 127.0.0.1.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_serve.py -q
"""

import json
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

import chroma
from chroma.serve import Model, RequestError, call, decode_safetensors, deployment, encode_safetensors

ray = pytest.importorskip("ray", reason="ray[serve] is in requirements.txt; a machine without it skips the serving tests")
requests = pytest.importorskip("requests", reason="requests comes with ray[serve]")


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.a = nn.Linear(12, 32)
        self.b = nn.Linear(32, 3)

    def forward(self, x, scale):
        h = torch.tanh(self.a(x)) * scale
        return self.b(h).softmax(-1), h.sum(-1)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("serve") / "m")
    chroma.compile(TwoHeads().eval(), (torch.randn(2, 12), torch.rand(2, 1)), batch=(1, 16), out=out)
    return out


def inputs(b, seed):
    g = np.random.default_rng(seed)
    return g.standard_normal((b, 12)).astype(np.float32), g.random((b, 1)).astype(np.float32)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- without Ray ----------------------------------------------------------------------------

def test_safetensors_round_trip():
    import ml_dtypes

    ts = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], np.int64),
          "c": np.array([[True, False]]), "d": np.array([1.5, -3], ml_dtypes.bfloat16), "e": np.zeros((0, 4), np.float16)}
    back = decode_safetensors(encode_safetensors(ts))
    assert set(back) == set(ts)
    for k in ts:
        assert back[k].dtype == ts[k].dtype and back[k].shape == ts[k].shape
        np.testing.assert_array_equal(back[k].astype(np.float64), ts[k].astype(np.float64))


def _st(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("body,msg", [
    (b"\x01\x02", "shorter than"),
    (struct.pack("<Q", 1 << 40) + b"{}", "header length"),
    (struct.pack("<Q", 3) + b"{x}", "not JSON"),
    (_st([1, 2]), "not an object"),
    (_st({"x": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "field 'dtype'"),
    (_st({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "field 'shape'"),
    (_st({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 4), "field 'data_offsets'"),
    (_st({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8 bytes"),
    (_st({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "y": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8), "overlap"),
])
def test_malformed_safetensors_are_named(body, msg):
    with pytest.raises(RequestError, match=msg):
        decode_safetensors(body)


def test_validation(artifact):
    m = Model(chroma.load(artifact), max_bytes=10_000)
    x, s = inputs(3, 0)
    ok = m.validate([x.tolist(), s.tolist()], exact_dtype=False)
    assert [a.dtype for a in ok] == [np.float32, np.float32]
    cases = [
        ([x], 400, "expected 2 inputs"),
        ([x[:, :5], s], 400, r"input 0 \('x'\): shape \[3, 5\]"),
        ([x, s[:2]], 400, "input 1 .* 2 rows, input 0 has 3"),
        ([x.astype(np.float64), s], 400, "dtype float64"),
        ([[[1, 2], [3]], s], 400, "rectangular|numbers"),
        ([[["a"] * 12], s[:1]], 400, "numbers"),
        ([np.zeros((17, 12), np.float32), np.zeros((17, 1), np.float32)], 413, "17 rows"),
        ([np.zeros((0, 12), np.float32), np.zeros((0, 1), np.float32)], 400, "0 rows"),
    ]
    for arrays, status, msg in cases:
        with pytest.raises(RequestError, match=msg) as e:
            m.validate(arrays, exact_dtype=True)
        assert e.value.status == status
    small = Model(chroma.load(artifact), max_bytes=100)
    with pytest.raises(RequestError, match="input bytes") as e:
        small.validate([x, s], exact_dtype=True)
    assert e.value.status == 413
    with pytest.raises(RequestError, match="content type") as e:
        m.parse(b"x", "text/plain")
    assert e.value.status == 415
    for body, msg in [(b"[1]", '"inputs"'), (b'{"inputs": {"x": [[0]]}}', "missing"),
                      (b'{"inputs": {"q": 1}}', "unknown name")]:
        with pytest.raises(RequestError, match=msg):
            m.parse(body, "application/json")


# ---- a local Ray instance -------------------------------------------------------------------

def _post(port, arrays, binary, path="/"):
    if binary:
        body = encode_safetensors({"x": arrays[0], "scale": arrays[1]})
        r = requests.post(f"http://127.0.0.1:{port}{path}", data=body, headers={"content-type": "application/x-safetensors"},
                          timeout=60)
        return r, (decode_safetensors(r.content) if r.status_code == 200 else None)
    r = requests.post(f"http://127.0.0.1:{port}{path}", json={"inputs": [a.tolist() for a in arrays]}, timeout=60)
    return r, (r.json() if r.status_code == 200 else None)


def _outputs(decoded, binary):
    if binary:
        return [decoded[f"output{i}"] for i in range(len(decoded))]
    return [np.asarray(o, np.float32) for o in decoded["outputs"]]


def _replica_actors():
    from ray.util import list_named_actors

    return [a for a in list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]


def test_one_replica_http_handle_faults(artifact):
    from ray import serve

    ref = chroma.load(artifact)
    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        handle = serve.run(deployment(artifact, max_batch_size=16, batch_wait_timeout_s=0.01).bind(), name="m",
                           route_prefix="/")
        # Several batch sizes, both encodings, both routes.
        for i, b in enumerate((1, 2, 5, 16)):
            x = inputs(b, i)
            for binary in (False, True):
                r, dec = _post(port, x, binary, "/predict" if binary else "/")
                assert r.status_code == 200, r.text
                for got, want in zip(_outputs(dec, binary), ref(*x)):
                    np.testing.assert_array_equal(got, want)
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=30).json() == {"status": "ok"}
        meta = requests.get(f"http://127.0.0.1:{port}/metadata", timeout=30).json()
        assert meta["batch"] == [1, 16] and meta["inputs"][0]["shape"] == ["batch", 12]
        # Bad requests: 4xx naming the problem; the replica keeps serving.
        bad = [(b"{not json", "application/json", 400, "not JSON"),
               (json.dumps({"inputs": [[[1.0] * 12]]}).encode(), "application/json", 400, "expected 2 inputs"),
               (json.dumps({"inputs": [np.zeros((20, 12)).tolist(), np.zeros((20, 1)).tolist()]}).encode(),
                "application/json", 413, "20 rows"),
               (b"\xff" * 9, "application/x-safetensors", 400, "header length"),
               (b"hello", "text/plain", 415, "content type")]
        for body, ct, status, msg in bad:
            r = requests.post(f"http://127.0.0.1:{port}/", data=body, headers={"content-type": ct}, timeout=60)
            assert r.status_code == status and msg in r.json()["error"], (r.status_code, r.text)
        assert requests.get(f"http://127.0.0.1:{port}/nope", timeout=30).status_code == 404
        r, dec = _post(port, inputs(3, 9), False)
        assert r.status_code == 200
        # The handle, and concurrent clients merged into shared calls.
        x = inputs(4, 10)
        for got, want in zip(call(handle, *x), ref(*x)):
            np.testing.assert_array_equal(got, want)
        wrong = []

        def client(k):
            for j in range(4):
                xs = inputs(1 + (k + j) % 7, 100 * k + j)
                r, dec = _post(port, xs, k % 2 == 1)
                if r.status_code != 200 or any(not np.array_equal(g, w) for g, w in zip(_outputs(dec, k % 2 == 1), ref(*xs))):
                    wrong.append((k, j, r.status_code))

        ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not wrong, wrong
        # A replica killed mid-traffic: Ray Serve starts another; calls through the handle
        # are retried (chroma.serve.call); every answer arrives and is right.
        answers, failures = [], []
        stop = threading.Event()

        def traffic():
            k = 0
            while not stop.is_set() or k < 20:
                xs = inputs(1 + k % 5, 1000 + k)
                try:
                    answers.append((xs, call(handle, *xs, retries=20, backoff_s=0.5)))
                except Exception as e:  # noqa: BLE001 (counted)
                    failures.append(repr(e))
                k += 1

        t = threading.Thread(target=traffic)
        t.start()
        time.sleep(1.0)
        victims = _replica_actors()
        assert victims, "no replica actor found"
        ray.kill(ray.get_actor(victims[0]["name"], namespace=victims[0]["namespace"]), no_restart=True)
        time.sleep(3.0)
        stop.set()
        t.join(timeout=300)
        assert not t.is_alive()
        assert not failures, failures
        assert len(answers) >= 20
        deadline = time.time() + 120  # Ray Serve replaced the killed replica
        while time.time() < deadline and [a["name"] for a in _replica_actors()] in ([], [victims[0]["name"]]):
            time.sleep(0.5)
        now = [a["name"] for a in _replica_actors()]
        assert now and victims[0]["name"] not in now, (victims, now)
        for xs, got in answers:
            for g, w in zip(got, ref(*xs)):
                np.testing.assert_array_equal(g, w)
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_node_cluster(artifact):
    """Two Ray nodes on this machine (one CPU each); two replicas of one CPU each: one lands
    on each node, and both answer."""
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ref = chroma.load(artifact)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        app = deployment(artifact, num_replicas=2, threads=1, ray_actor_options={"num_cpus": 1}).bind()
        handle = serve.run(app, name="m2", route_prefix="/")
        nodes = set()
        deadline = time.time() + 120
        while len(nodes) < 2 and time.time() < deadline:
            nodes.add(handle.node_id.remote().result())
        assert len(nodes) == 2, nodes
        assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2
        x = inputs(6, 5)
        for got, want in zip(call(handle, *x), ref(*x)):
            np.testing.assert_array_equal(got, want)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
