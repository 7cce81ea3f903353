"""Routing replies on an upstream kernel's one WebSocket to the client that asked
(kernel_gateway_stream.kernels.upstream_channels.ReplyRoutes): pure, no loop."""

from __future__ import annotations

from kernel_gateway_stream.kernels.upstream_channels import ReplyRoutes


def test_a_reply_goes_to_the_owner_of_its_request_and_ends_the_route() -> None:
    routes = ReplyRoutes()
    routes.sent("a", "m1", "execute_request")
    routes.sent("b", "m2", "kernel_info_request")
    # input_request on stdin keeps the route: the execute_reply comes after input_reply.
    assert routes.route("stdin", "m1", "input_request") == "a"
    assert routes.route("shell", "m2", "kernel_info_reply") == "b"
    assert routes.route("shell", "m1", "execute_reply") == "a"
    assert routes.route("shell", "m1", "execute_reply") is None
    assert len(routes) == 0


def test_messages_that_are_not_requests_and_unknown_parents_route_nowhere() -> None:
    routes = ReplyRoutes()
    routes.sent("a", "m1", "comm_msg")
    routes.sent("a", "m2", "input_reply")
    assert len(routes) == 0
    # The gateway's own nudges: a reply whose parent nobody sent.
    assert routes.route("shell", "nudge", "kernel_info_reply") is None


def test_an_owner_that_closes_leaves_nothing_pending() -> None:
    routes = ReplyRoutes()
    routes.sent("a", "m1", "execute_request")
    routes.sent("a", "m2", "complete_request")
    routes.sent("b", "m3", "execute_request")
    routes.forget("a")
    assert routes.pending("a") == 0
    assert len(routes) == 1
    assert routes.route("shell", "m1", "execute_reply") is None
    assert routes.route("shell", "m3", "execute_reply") == "b"


def test_routes_per_owner_are_bounded_oldest_first() -> None:
    routes = ReplyRoutes(max_routes=2)
    for index in range(3):
        routes.sent("a", f"m{index}", "execute_request")
    assert routes.forgotten == 1
    assert routes.route("shell", "m0", "execute_reply") is None
    assert routes.route("shell", "m2", "execute_reply") == "a"


def test_a_msg_id_sent_again_by_another_owner_is_theirs() -> None:
    routes = ReplyRoutes()
    routes.sent("a", "m1", "execute_request")
    routes.sent("b", "m1", "execute_request")
    assert routes.pending("a") == 0
    assert routes.route("shell", "m1", "execute_reply") == "b"
