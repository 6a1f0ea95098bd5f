"""bench/layers.py's reading of py-spy's samples: the same request path gives the same layers whether its
frames are Python's (Class.method) or a Cython build's (the function's C name, Cython's inlined helpers named
by the caller's line), and what names no layer of ours is the transport's."""

from bench.layers import breakdown, compiled_module, layer_of

LOOP = "uv_run (core.c:464);uv__io_poll (linux.c:1546)"


def test_a_cython_name_gives_its_module() -> None:
    assert compiled_module("__pyx_gb_6server_4http_2h1_12H1Connection_34generator") == "server/http/h1.py"
    assert compiled_module("__pyx_pw_5codec_7v2_http_3decode_request") == "codec/v2_http.py"
    assert compiled_module("__pyx_gb_6uvloop_4loop_6Loop_1run") == ""  # not ours


def test_python_and_compiled_frames_of_one_path_fall_in_the_same_layers() -> None:
    python = {
        "H1Connection._flush (server/http/connection.py:120)": "write",
        "H1Connection.on_header (server/http/h1.py:230)": "parse",
        "_decode_input (codec/v2_http.py:166)": "decode",
        "encode_response (codec/v2_http.py:300)": "encode",
        "Router.call (server/router.py:118)": "route",
        "DirectScheduler.run_now (batcher/direct.py:64)": "model",
    }
    for frame, layer in python.items():
        assert layer_of(frame) == layer, frame
        function, _, where = frame.partition(" (")
        compiled = f"{function.rpartition('.')[2]} ({where}"
        assert layer_of(compiled) == layer, compiled
    # an inlined helper, and a compiled coroutine's body, leave the transport's files to the real function
    assert layer_of("__Pyx_PyObject_GetAttrStr (server/http/h1.py:178)") is None
    assert layer_of("__pyx_gb_6server_4http_2h1_12H1Connection_34generator") is None
    assert layer_of("__pyx_gb_6server_5model_12ModelVersion_15generator1") == "model"


def test_breakdown_counts_the_innermost_layer_and_leaves_threads_out() -> None:
    raw = "\n".join(
        (
            f"{LOOP};buffer_updated (server/http/h1.py:178);__Pyx_PyObject_Call (server/http/h1.py:190);"
            "_decode_input (codec/v2_http.py:166);PyArray_FromAny (numpy.so) 3",
            f"{LOOP};_flush (server/http/connection.py:126);write (loop.c:110207);write (libc.so.6) 1",
            f"{LOOP};epoll_pwait (libc.so.6) 1",
            "thread_run (libpython3.11.so);Thread._bootstrap (threading.py:1002) 50",
        )
    )
    shares = breakdown(raw)
    assert shares["samples"] == 5
    assert (shares["decode"], shares["write"], shares["transport"]) == (0.6, 0.2, 0.2)
