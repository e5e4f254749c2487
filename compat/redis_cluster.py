"""redis-py's asyncio Cluster client (5.x, bounded in pyproject.toml), past its interface: an
ASK redirect answered on one connection, and a `TRYAGAIN` waited out.

While a slot moves between primaries, a key already moved is answered by the old owner with
ASK, and the new owner serves it only to a connection that has just sent `ASKING`. redis-py
(5.3 and 8.0 alike) sends `ASKING` and then the command as two separate node commands, each
taking a connection from the node's free list, which hands out the oldest free connection
first: with more than one connection open to the new owner, the command goes out on another
connection than the `ASKING`, the new owner answers MOVED back to the old one, which answers
ASK again, until the client's 16 redirects run out ("TTL exhausted"). A worker streaming to a
turn whose slot moved failed the turn so (tests/test_topologies.py, the slot moving mid
stream: 1 run in 6 on this box). `AskingCluster` sends the two together on one connection.

While the slot's keys are between the two nodes, a command naming several of them, one of
which is not there (a script's key that does not exist, as the attached set of a turn no
client watches), is answered `TRYAGAIN` for as long as the migration lasts. redis-py tries 16
times in all, waiting 50 ms only from the 8th: about 0.4 s, then "TTL exhausted". The FINISH
of a turn no client watched (three keys, its attached set not there) failed so whenever it
landed while its slot moved.
`AskingCluster` waits a `TRYAGAIN` out, with backoff, for up to `TRYAGAIN_S`.

`AskingCluster._execute_command` is redis-py 5.3's loop with those two branches changed;
tests/compat/test_redis_cluster.py fails when redis-py's loop changes, so the copy is
compared again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from redis.asyncio.cluster import (
    READ_COMMANDS,
    ClusterNode,
    PipelineCommand,
    RedisCluster,
    get_node_name,
)
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    MaxConnectionsError,
    MovedError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

__all__ = ["TRYAGAIN_S", "AskingCluster", "asking_then"]

# How long a command answered TRYAGAIN (its slot's keys mid-migration) is tried again: a
# slot's keys move in milliseconds to seconds (`redis-cli --cluster reshard` moves them in
# batches); then the redirects' own limit applies again.
TRYAGAIN_S = 10.0


async def asking_then(node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
    """`ASKING`, then the command, written together on one of `node`'s connections; the
    command's reply, or the error it got raised."""
    asking, command = PipelineCommand(0, "ASKING"), PipelineCommand(1, *args, **kwargs)
    await node.execute_pipeline([asking, command])
    for sent in (asking, command):
        if isinstance(sent.result, Exception):
            raise sent.result
    return command.result


class AskingCluster(RedisCluster):
    """A `RedisCluster` whose ASK redirects hold while a slot migrates (module docstring)."""

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        asking = moved = False
        redirect_addr = None
        ttl = self.RedisClusterRequestTTL
        waited = 0  # TRYAGAINs so far
        until = 0.0  # when they stop being waited out

        while ttl > 0:
            ttl -= 1
            try:
                if asking:
                    target_node = cast(ClusterNode, self.get_node(node_name=redirect_addr))
                    asking = False
                    # The one change from redis-py: not two commands, each on whichever
                    # connection the node's free list gives.
                    return await asking_then(target_node, *args, **kwargs)
                if moved:
                    slot = await self._determine_slot(*args)
                    target_node = self.nodes_manager.get_node_from_slot(
                        slot,
                        self.read_from_replicas and args[0] in READ_COMMANDS,
                        self.load_balancing_strategy if args[0] in READ_COMMANDS else None,
                    )
                    moved = False

                return await target_node.execute_command(*args, **kwargs)
            except (BusyLoadingError, MaxConnectionsError):
                raise
            except (ConnectionError, TimeoutError):
                self.nodes_manager.startup_nodes.pop(target_node.name, None)
                await self.aclose()
                raise
            except (ClusterDownError, SlotNotCoveredError):
                await self.aclose()
                await asyncio.sleep(0.25)
                raise
            except MovedError as e:
                self.reinitialize_counter += 1
                if (
                    self.reinitialize_steps
                    and self.reinitialize_counter % self.reinitialize_steps == 0
                ):
                    await self.aclose()
                    self.reinitialize_counter = 0
                else:
                    self.nodes_manager._moved_exception = e
                moved = True
            except AskError as e:
                redirect_addr = get_node_name(host=e.host, port=e.port)
                asking = True
            except TryAgainError:
                # The second change: Redis says the migration is under way, which takes as
                # long as it takes; the redirects around each try are not counted meanwhile.
                if waited == 0:
                    until = time.monotonic() + TRYAGAIN_S
                waited += 1
                if time.monotonic() < until:
                    ttl = self.RedisClusterRequestTTL
                await asyncio.sleep(min(0.01 * 2**waited, 0.25))

        raise ClusterError("TTL exhausted.")
