import httpx


def test_chat_roundtrip(gateway, stub):
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "ok"
    assert stub.state.requests[-1]["cache_salt"]
    (record,) = gateway.wait_records(1)
    assert record.status_code == 200
    assert record.cached_tokens == 4
    assert record.miss_kind == "partial"
