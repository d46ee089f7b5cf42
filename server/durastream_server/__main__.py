"""``python -m durastream_server`` runs the same CLI as the ``durastream-server`` script."""

from durastream_server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
