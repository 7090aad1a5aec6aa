"""The OpenAI-compatible API with the real `openai` client, against a live uvicorn server and through Ray
Serve: models, completions (n > 1, seeds, prefixes and templates), streaming deltas, errors."""

import openai
import pytest
from servers import start_ray_serve

pytestmark = pytest.mark.slow  # servers


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused-on-an-open-server", max_retries=0, timeout=120)


def _check_api(url: str):
    client = _client(url)
    ids = {m.id for m in client.models.list().data}
    assert {"qm9-none-r1", "qm9-tt-r2", "qm9-cp-r3", "text-none-r1"} <= ids
    a = client.completions.create(model="qm9-tt-r2", prompt="CC", n=3, seed=7, extra_body={"steps": 6})
    b = client.completions.create(model="qm9-tt-r2", prompt="CC", n=3, seed=7, extra_body={"steps": 6})
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # seeds reproduce
    assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in a.choices)
    assert a.usage.prompt_tokens == 2 and a.usage.total_tokens == 2 + a.usage.completion_tokens
    assert a.model == "qm9-tt-r2" and a.object == "text_completion"
    # the same request through /generate fills the same canvas: the completion is its text after the prefix
    echo = client.completions.create(model="qm9-tt-r2", prompt="CC", n=3, seed=7, echo=True, extra_body={"steps": 6})
    assert [c.text for c in echo.choices] == ["CC" + c.text for c in a.choices]
    # streaming: the deltas of each choice concatenate to the non-streamed text
    parts, reasons, canvases = {}, {}, []
    for chunk in client.completions.create(model="qm9-tt-r2", prompt="CC", n=3, seed=7, stream=True,
                                           extra_body={"steps": 6}):
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + c.text
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
        canvases.append(chunk.model_extra["ttcore"]["canvas"])
    assert [parts[i] for i in range(3)] == [c.text for c in a.choices]
    assert all(reasons[i] in ("stop", "length") for i in range(3))
    assert "[MASK]" in canvases[0] and "[MASK]" not in canvases[-1]
    # a text prefix, max_tokens, and usage in the stream
    text_parts, usage = "", None
    for chunk in client.completions.create(model="text", prompt="The state of the", max_tokens=8, seed=1,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"steps": 8}):
        text_parts += "".join(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    whole = client.completions.create(model="text", prompt="The state of the", max_tokens=8, seed=1,
                                      extra_body={"steps": 8})
    assert text_parts == whole.choices[0].text and usage.completion_tokens == whole.usage.completion_tokens <= 8
    # a template: the completion is the whole filled sequence
    filled = client.completions.create(model="qm9", prompt="C[MASK]C", seed=0, extra_body={"steps": 4})
    assert filled.choices[0].text.startswith("C")
    # the adaptive path is an extension: both values served, seeded alike; anything else is refused by name
    for path in ("fast", "exact"):
        eb = client.completions.create(model="qm9-tt-r2", prompt="CC", n=2, seed=3, extra_body={
            "steps": 4, "sampler": "eb", "adaptive_path": path})
        assert len(eb.choices) == 2
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="qm9", prompt="CC", extra_body={"adaptive_path": "approximate"})
    assert e.value.body["param"] == "adaptive_path"
    # errors arrive as openai exceptions with OpenAI's error object
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="qm9", prompt="CC", n=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="qm9", prompt="CC", extra_body={"frobnicate": 1})
    assert "frobnicate" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="qm9", prompt="CXC")
    assert e.value.body["param"] == "prompt"


def test_openai_client_against_uvicorn(server):
    _check_api(server)


def test_openai_client_through_ray_serve(checkpoints):
    proc, url = start_ray_serve({"checkpoints": str(checkpoints), "threads": 1})
    try:
        _check_api(url)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_extras_openai_compatible_clients_send_are_accepted_and_honoured(server):
    """The review: a benchmark client (guidellm) got 400 on every request for vLLM's ``ignore_eos``. The common
    extras are accepted: ``ignore_eos`` and ``min_tokens`` honoured (an end token does not end the completion),
    the penalties, ``best_of``, ``top_k`` and ``logit_bias`` at their neutral values; other values are refused
    naming the field."""
    import httpx

    body = {"model": "text", "prompt": "The", "n": 4, "steps": 8, "seed": 3}
    plain = httpx.post(server + "/v1/completions", json=body, timeout=120)
    extras = dict(body, ignore_eos=True, min_tokens=2, best_of=1, presence_penalty=0, frequency_penalty=0,
                  repetition_penalty=1, top_k=-1, logit_bias={}, stream_options={"include_usage": True,
                                                                                "continuous_usage_stats": False})
    full = httpx.post(server + "/v1/completions", json=extras, timeout=120)
    assert plain.status_code == 200 and full.status_code == 200, full.text
    assert all(c["finish_reason"] == "length" for c in full.json()["choices"])  # never cut at an end token
    assert full.json()["usage"]["completion_tokens"] >= plain.json()["usage"]["completion_tokens"]
    for field, value in (("presence_penalty", 0.5), ("best_of", 2), ("top_k", 5), ("logit_bias", {"1": 2.0})):
        r = httpx.post(server + "/v1/completions", json=dict(body, **{field: value}), timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_chat_completions_answer_text_families_and_refuse_molecules_by_name(server):
    """The review: a benchmark client's default route, ``/v1/chat/completions``, was 404. A text family writes the
    conversation into its prompt by its chat template (``service.chat.plain``: the messages' texts, a blank line
    apart) and replies with that prompt's completion, the same text ``/v1/completions`` gives for it, whole or
    streamed through the real client; a family without a chat template (molecules) gets 400 naming the model
    and why; bad messages name the field."""
    import httpx

    from service.chat import plain
    from service.openai_schema import ChatMessage

    client = _client(server)
    messages = [{"role": "system", "content": "Mr. Speaker"}, {"role": "user", "content": "The state of the"}]
    prompt = plain([ChatMessage(**m) for m in messages])
    assert prompt == "Mr. Speaker\n\nThe state of the\n\n"
    kw = dict(model="text", max_tokens=8, seed=2, n=2, extra_body={"steps": 8})
    chat = client.chat.completions.create(messages=messages, **kw)
    text = client.completions.create(prompt=prompt, **kw)
    assert chat.object == "chat.completion" and chat.model == "text-none-r1"
    assert [c.message.content for c in chat.choices] == [c.text for c in text.choices]
    assert all(c.message.role == "assistant" and c.finish_reason in ("stop", "length") for c in chat.choices)
    assert chat.usage.prompt_tokens == text.usage.prompt_tokens
    parts, roles, usage = {}, set(), None
    for chunk in client.chat.completions.create(messages=messages, stream=True,
                                                stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
            roles |= {c.delta.role} - {None}
        usage = chunk.usage or usage
    assert [parts[i] for i in range(2)] == [c.message.content for c in chat.choices]
    assert roles == {"assistant"} and usage.completion_tokens == chat.usage.completion_tokens
    parts = [{"type": "text", "text": "The state of "}, {"type": "text", "text": "the"}]  # content parts
    same = client.chat.completions.create(messages=[messages[0], {"role": "user", "content": parts}], **kw)
    assert [c.message.content for c in same.choices] == [c.message.content for c in chat.choices]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qm9", messages=[{"role": "user", "content": "C"}])
    assert e.value.body["param"] == "model" and "no chat template" in e.value.body["message"]
    for bad, param in (({"messages": []}, "messages"), ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
                       ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs")):
        r = httpx.post(server + "/v1/chat/completions", json={"model": "text", **bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), r.text
