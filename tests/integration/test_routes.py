"""test_routes.py - the server's route table (ddpmd serve --routes) and openapi.yaml's paths list
the same METHOD PATH pairs, so the contract never promises a route that is not there or hides
one that is. Usage: test_routes.py PATH/TO/ddpmd
"""
import subprocess
import sys

from serverlib import OPENAPI, check

METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def main(exe):
    out = subprocess.run([exe, "serve", "--routes"], capture_output=True, check=True, timeout=30)
    served = sorted(tuple(l.split(" ", 1)) for l in out.stdout.decode().splitlines() if l)
    documented = sorted((m.upper(), path) for path, ops in OPENAPI["paths"].items()
                        for m in ops if m in METHODS)
    check(served, "no routes printed")
    check(served == documented, "served but not in openapi.yaml: %s; in openapi.yaml but not served: %s"
          % (sorted(set(served) - set(documented)), sorted(set(documented) - set(served))))
    print("test_routes: ok (%d routes)" % len(served))


if __name__ == "__main__":
    main(sys.argv[1])
