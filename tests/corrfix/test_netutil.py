"""Port picking for the lab, the benchmarks and the tests."""

from __future__ import annotations

import socket

from corrfix._netutil import free_ports


def test_free_ports_are_different_and_each_can_be_bound():
    for _ in range(200):  # one at a time, the kernel hands a released port out again now and then
        ports = free_ports(3)
        assert len(set(ports)) == 3
    with socket.create_server(("127.0.0.1", ports[0])), socket.create_server(("127.0.0.1", ports[1])):
        pass
