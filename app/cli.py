"""`gguf-chat`: one entry point, a subcommand a module. Each command module has register(subparsers).

Command modules import their heavy dependencies inside their run function, so `gguf-chat run` starts fast.
"""
import argparse
import sys

from kernels.cpu.threads import configure_thread_waits

configure_thread_waits()  # before numpy loads (cmd_bench and models import it): how the CPU thread pools wait

from app import cmd_bench, cmd_chat, cmd_info, cmd_list, cmd_pull, cmd_rm, cmd_run, cmd_serve  # noqa: E402
from models.errors import UserError  # noqa: E402

COMMANDS = [cmd_info, cmd_pull, cmd_list, cmd_rm, cmd_run, cmd_bench, cmd_chat, cmd_serve]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguf-chat", description="Chat with GGUF models on your own machine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        cmd.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"gguf-chat: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
