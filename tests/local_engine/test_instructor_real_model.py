"""instructor's default mode (`Mode.TOOLS`: a tool named by `tool_choice`, not strict) against SmolLM2 over HTTP:
the forced call follows the response model's schema, so every answer validates, first time (no retries)."""

from __future__ import annotations

from typing import Literal

import instructor
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from .server_fixtures import served_engine

pytestmark = pytest.mark.real_model


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    age: int
    height_m: float
    is_member: bool
    role: Literal["admin", "user", "guest"]
    # Bounded: greedy SmolLM2 can repeat a list's item until max_tokens, which a schema without maxItems allows.
    hobbies: list[str] = Field(max_length=3)
    address: Address


TEXTS = [
    "Ann Berg is 31, 1.68 m tall, a member and an admin. She lives in Oslo, Norway and likes skiing and chess.",
    "Carlos Ruiz, 45, from Madrid in Spain. Height 1.80 m. Not a member. A guest who enjoys football.",
    "Meet Li Wei: 27 years old, 1.75 m, member, regular user, Shanghai (China), hobbies: painting, hiking.",
    "Fatima Zahra lives in Rabat, Morocco. She is 52 and 1.60 m tall, a user and a member who reads novels.",
    "Tom Baker (age 19, 1.92 m) is a guest from Leeds, United Kingdom. He is no member. He plays guitar.",
    "Olga Petrova, 38, 1.70 m, admin, member. Address: Kyiv, Ukraine. Hobbies: running, photography, cooking.",
    "Kenji Sato is a 64-year-old user from Osaka, Japan, 1.65 m tall, not a member, fond of gardening.",
    "Amara Okafor, 23, is a member and user living in Lagos, Nigeria. 1.72 m. She dances and writes poems.",
    "Lukas Meyer: 33 years, 1.85 m, guest, Berlin, Germany, member. Likes cycling.",
    "Sofia Rossi, 41, admin, not a member, 1.63 m, from Rome, Italy. Her hobbies are opera and sailing.",
]


@pytest.fixture(scope="module")
def client(smollm2_loaded):
    with served_engine(smollm2_loaded, kv_cache_tokens=8192) as (base_url, _):
        openai_client = OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=300)
        yield instructor.from_openai(openai_client, mode=instructor.Mode.TOOLS)


def test_instructor_tools_mode_gets_a_valid_object_every_time(client):
    people = []
    for text in TEXTS:
        person = client.chat.completions.create(
            model="smollm2",
            response_model=Person,
            messages=[{"role": "user", "content": "Extract the person described here.\n\n" + text}],
            max_retries=0,  # a failure must show, not be retried away
            temperature=0,
            max_tokens=256,
        )
        assert isinstance(person, Person) and isinstance(person.address, Address)
        people.append(person)
    assert len(people) == len(TEXTS)
