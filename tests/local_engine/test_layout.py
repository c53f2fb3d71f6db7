"""The engine's rooms (folders and root modules) are layers: a room imports only rooms of lower layers.

`tests/test_import_direction.py` checks that local_engine imports no other program and that its rooms import each
other in no cycle; this adds the direction, top to bottom."""

from __future__ import annotations

from tests.test_import_direction import modules_of, room_edges, room_of

LAYERS = (
    {"cli"},
    {"bench"},
    {"api"},
    {"engine"},
    {"prompt", "model"},  # side by side: neither imports the other
    {"cache"},
    {"config"},  # the settings with their flags, the KV-event settings among them
    {"kv_events"},
    {"options", "errors", "hash_chain", "telemetry"},
)
LAYER_OF = {f"local_engine.{room}": depth for depth, rooms in enumerate(LAYERS) for room in rooms}


def test_every_room_has_a_layer():
    rooms = {room_of(module) for module in modules_of("local_engine")} - {"local_engine"}
    assert rooms == set(LAYER_OF)


def test_rooms_import_only_lower_layers():
    upward = sorted(
        f"{source} -> {target}: {why[0]}"
        for (source, target), why in room_edges("local_engine").items()
        if LAYER_OF[target] <= LAYER_OF[source]
    )
    assert upward == []
