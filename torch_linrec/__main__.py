"""``python -m torch_linrec``: check every implementation, benchmark the case suite, then the selective
scan (sections ``--sections scan,selective``);
``python -m torch_linrec tune``: tune the kernel configs of this GPU (the tuned config cache);
``python -m torch_linrec selective``: the selective-scan (Mamba) benchmark alone;
``python -m torch_linrec layers [--anchors]``: tokens/s of the torch_linrec.nn layers, fused vs plain
PyTorch (``--anchors``: the layers' GPU performance anchors).

See :mod:`torch_linrec.bench.cli`, :mod:`torch_linrec.bench.tune` and ``--help``.
"""
import sys

from .bench import main


def _main(argv: list[str]) -> int:
    if argv[:1] == ["selective"]:
        from .bench.selective import main as selective_main
        return selective_main(argv[1:])
    if argv[:1] == ["layers"]:
        from .bench.layers import main as layers_main
        return layers_main(argv[1:])
    if argv[:1] == ["tune"]:
        from .bench.tune import main as tune_main
        return tune_main(argv[1:])
    return main(argv)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
