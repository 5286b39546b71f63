"""The wheel holds native code (the tpshard program, libtpshard.so) but no
Python extension module: it is tagged py3-none-<platform>, for any Python 3
on this platform. make wheel stages bin/, lib/ and man/ before building."""
import glob

from setuptools import setup
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # installs into platlib, as native code must
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


setup(
    distclass=BinaryDistribution,
    cmdclass={"bdist_wheel": PlatformWheel},
    # man pages where `man` finds them for a venv on PATH (<venv>/share/man)
    data_files=[("share/man/man1", sorted(glob.glob("man/man1/*.1"))),
                ("share/man/man5", sorted(glob.glob("man/man5/*.5")))],
)
