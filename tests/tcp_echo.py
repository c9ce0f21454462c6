"""Tiny TCP echo pair, run inside namespaces with `ip netns exec`.

    tcp_echo.py server ADDR PORT      echo one connection, then exit
    tcp_echo.py client ADDR PORT N    send N random bytes, check the echo, print "ok <N>"
"""

import hashlib
import os
import socket
import sys
import threading


def server(addr: str, port: int) -> None:
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addr, port))
        ls.listen(1)
        print("listening", flush=True)
        ls.settimeout(30)
        conn, _ = ls.accept()
        with conn:
            conn.settimeout(30)
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)


def client(addr: str, port: int, n: int) -> None:
    data = os.urandom(n)
    got = bytearray()
    with socket.create_connection((addr, port), timeout=30) as s:
        t = threading.Thread(target=lambda: (s.sendall(data), s.shutdown(socket.SHUT_WR)))
        t.start()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        t.join()
    if bytes(got) != data:
        sys.exit(f"echo mismatch: sent {len(data)} bytes sha256 {hashlib.sha256(data).hexdigest()}, "
                 f"got {len(got)} bytes sha256 {hashlib.sha256(got).hexdigest()}")
    print(f"ok {n}")


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]))
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
