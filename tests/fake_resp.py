#!/usr/bin/env python3
"""tests/fake_resp.py - a tiny misbehaving Redis (RESP) server for
tests/test_remote_bounds.sh, on 127.0.0.1 with a free port (written to
PORTFILE once it listens). It answers what opjit's remote layer asks with
plausible replies, except:

  drip N SECONDS   GET answers a bulk string of N bytes sent one byte every
                   SECONDS (a server, or a path, that sends slowly)
  scan             SCAN never returns the cursor 0 (one key a page), and
                   DBSIZE says 2 keys

Usage: fake_resp.py PORTFILE MODE [ARGS...]. Stopped by its PID.
"""
import os
import socketserver
import sys
import time


def read_command(f):
    """One command (an array of bulk strings) as a list of bytes; None at EOF."""
    line = f.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return line.split()
    args = []
    for _ in range(int(line[1:])):
        n = int(f.readline()[1:])
        args.append(f.read(n + 2)[:n])
    return args


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


class Handler(socketserver.StreamRequestHandler):
    def reply(self, cmd, args):
        mode = self.server.mode
        if cmd == b"GET" and mode[0] == "drip":
            n, pause = int(mode[1]), float(mode[2])
            data = b"$%d\r\n" % n + b"x" * n + b"\r\n"
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(pause)
            return None
        if cmd == b"SCAN":
            self.server.pages += 1
            key = b"opjit:v1:%032x" % self.server.pages
            return b"*2\r\n" + bulk(b"%d" % self.server.pages) + b"*1\r\n" + bulk(key)
        if cmd == b"DBSIZE":
            return b":2\r\n"
        if cmd == b"INFO":
            return bulk(b"# Memory\r\nused_memory:1000\r\nmaxmemory:0\r\n"
                        b"maxmemory_policy:noeviction\r\n")
        if cmd == b"PING":
            return b"+PONG\r\n"
        if cmd == b"SELECT":
            return b"+OK\r\n"
        if cmd in (b"STRLEN", b"EXISTS", b"DEL", b"EVAL"):
            return b":0\r\n"
        if cmd in (b"GET", b"GETRANGE", b"SET"):
            return b"$-1\r\n"
        return b"-ERR unknown command\r\n"

    def handle(self):
        try:
            while True:
                args = read_command(self.rfile)
                if not args:
                    return
                out = self.reply(args[0].upper(), args[1:])
                if out:
                    self.wfile.write(out)
                    self.wfile.flush()
        except (OSError, ValueError):
            return


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    portfile, mode = sys.argv[1], sys.argv[2:]
    srv = Server(("127.0.0.1", 0), Handler)
    srv.mode = mode
    srv.pages = 0
    with open(portfile + ".tmp", "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(portfile + ".tmp", portfile)
    srv.serve_forever()


if __name__ == "__main__":
    main()
