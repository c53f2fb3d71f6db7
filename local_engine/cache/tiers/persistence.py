"""The disk tier across restarts: rebuild disk nodes from the directory at start, write the cache down at stop.

Rebuild reads headers only (no payload byte): files are placed shortest path first, each under the node that ends
where its edge starts (splitting an edge when needed). A file whose parent path is not in the tree (its parent file
is gone or was skipped) is unreachable and deleted; a file that duplicates an edge already placed is deleted too.
Idle time of a rebuilt node counts from its file's mtime, which a clean stop sets to the node's last use.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from types import SimpleNamespace

from local_engine.cache.tiers.disk_index import IndexedFile
from local_engine.cache.tiers.disk_store import CorruptKVFile
from local_engine.cache.retention import Lifetime, extend
from local_engine.cache.radix_node import RadixNode, child_key, common_prefix_tokens
from local_engine.cache.tiers.eviction import make_room
from local_engine.cache.tiers.store import DISK

log = logging.getLogger(__name__)


def rebuild_from_disk(cache) -> int:
    """Index the disk tier's directory into the tree; returns the number of nodes rebuilt."""
    disk = cache.tiers.disk
    wall_now, now = time.time(), cache.now_s()
    page_size = cache.page_size
    rebuilt = 0
    for indexed in sorted(disk.scan(), key=lambda f: len(f.token_ids)):
        if indexed.edge_start % page_size or len(indexed.token_ids) % page_size:
            disk.corrupt_files_total += 1
            log.warning("disk KV cache: skipping %s: not page-aligned", indexed.file.name)
            continue
        parent = _node_ending_at(cache, indexed)
        tokens = indexed.token_ids
        if parent is None or child_key(tokens, indexed.edge_start, page_size) in parent.children:
            disk.delete(indexed.file)  # unreachable, or the same tokens are already served by another file
            continue
        last_used = now - max(0.0, wall_now - indexed.mtime_s)
        node = RadixNode(parent, tokens[indexed.edge_start :], None, last_used)
        node.disk = disk.adopt(indexed.file)
        node.ttl_s, node.persistent = indexed.ttl_s, indexed.persistent
        if indexed.ttl_s is not None:
            cache.enable_expiry()
        parent.children[child_key(tokens, indexed.edge_start, page_size)] = node
        cache.account(node, 1)
        rebuilt += 1
    over = disk.used_tokens - disk.capacity_tokens
    if over > 0:  # restarted with a smaller --disk-cache-gib
        make_room(cache, DISK, over)
    return rebuilt


def _node_ending_at(cache, indexed: IndexedFile) -> RadixNode | None:
    """The node whose path is exactly `token_ids[:edge_start]` (the root for 0), splitting an edge if it ends
    inside one; None when the tree does not hold that path."""
    node = cache.root_for(indexed.namespace)
    tokens, end, position = indexed.token_ids, indexed.edge_start, 0
    while position < end:
        child = node.children.get(child_key(tokens, position, cache.page_size))
        if child is None:
            return None
        same = common_prefix_tokens(child.key, tokens, position, end, cache.page_size)
        if same == 0:
            return None
        if same < child.num_tokens:
            child = cache.split(child, same)
        position += same
        node = child
    return node


def persist_to_disk(cache) -> int:
    """Write every cached node not yet on disk to disk, parents before children, while the disk tier has room
    (never evicting for it); returns the tokens written. Files of nodes already on disk get the node's last use as
    their mtime, so idle time survives the restart."""
    disk = cache.tiers.disk
    wall_offset = time.time() - cache.now_s()
    written = 0
    for namespace, root in cache.roots().items():
        queue = deque(root.children.values())
        while queue:
            node = queue.popleft()
            if node.disk is None:
                if disk.free_tokens < node.num_tokens:
                    continue  # its subtree would be unreachable without it
                k, v = cache.tiers.read(node, node.tier_index)
                cache.account(node, -1)
                stored = cache.tiers.put(node, DISK, k, v, namespace)
                cache.account(node, 1)
                if not stored:
                    continue
                written += node.num_tokens
            else:
                _record_longer_lifetime(disk, node)
            _touch(disk, node, node.last_access_s + wall_offset)
            queue.extend(node.children.values())
    return written


def _record_longer_lifetime(disk, node: RadixNode) -> None:
    """A node given a longer class after its file was written (a later request, a load back from disk) would get
    the file's shorter one back at the restart: rewrite the header with the longer of the two (a file shared by the
    halves of a split node keeps the longest of their classes)."""
    file = node.disk.file
    merged = SimpleNamespace(ttl_s=file.ttl_s, persistent=file.persistent)  # `extend` reads and sets these two
    extend(merged, Lifetime(node.ttl_s, node.persistent))
    if (merged.ttl_s, merged.persistent) == (file.ttl_s, file.persistent):
        return
    lifetime = Lifetime(merged.ttl_s, merged.persistent)
    try:
        disk.rewrite_retention(file, {"retention": lifetime.label, "ttl_s": lifetime.ttl_s,
                                      "persistent": lifetime.persistent})
    except (CorruptKVFile, OSError) as error:
        log.warning("disk KV cache: could not record the retention of %s: %s", file.name, error)


def _touch(disk, node: RadixNode, wall_s: float) -> None:
    path = os.path.join(disk.directory, node.disk.file.name)
    try:
        mtime = os.stat(path).st_mtime
        if wall_s > mtime or node.disk.start == 0:
            os.utime(path, (wall_s, wall_s))
    except OSError:
        pass
