#!/usr/bin/env python3
"""A tiny authoritative DNS server over UDP for the load-balancer test.

    dns_stub.py PORT ZONE_FILE

Answers A queries for any name listed in ZONE_FILE ("name address" lines)
with every address given for it, TTL 1; other names get NXDOMAIN, other
types an empty answer. ZONE_FILE is read again for every query, so a test
changes the answers by rewriting it (as a Service's DNS changes when a pod
leaves its endpoints). Listens on 127.0.0.1:PORT until killed.
"""
import socket
import struct
import sys


def read_zone(path):
    zone = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                zone.setdefault(parts[0].lower().rstrip("."), []).append(parts[1])
    return zone


def parse_question(msg):
    labels, i = [], 12
    while msg[i] != 0:
        n = msg[i]
        labels.append(msg[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype, qclass = struct.unpack("!HH", msg[i + 1:i + 5])
    return ".".join(labels).lower(), qtype, qclass, msg[12:i + 5]


def answer(msg, zone):
    (qid, flags, qdcount) = struct.unpack("!HHH", msg[:6])
    name, qtype, _, question = parse_question(msg)
    addrs = zone.get(name)
    rcode = 0 if addrs is not None else 3  # NXDOMAIN
    records = b""
    count = 0
    if addrs and qtype == 1:
        for a in addrs:
            # A pointer to the name in the question (offset 12), type A,
            # class IN, TTL 1, four bytes of address.
            records += struct.pack("!HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(a)
            count += 1
    rflags = 0x8000 | 0x0400 | (flags & 0x0100) | rcode  # response, authoritative, RD copied
    return struct.pack("!HHHHHH", qid, rflags, 1, count, 0, 0) + question + records


def main():
    port, zone_file = int(sys.argv[1]), sys.argv[2]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", port))
    print(f"listening on 127.0.0.1:{port}", flush=True)
    while True:
        msg, peer = sock.recvfrom(512)
        try:
            sock.sendto(answer(msg, read_zone(zone_file)), peer)
        except (IndexError, struct.error, OSError):
            continue


if __name__ == "__main__":
    main()
