"""Maps the user's fixed top-level layout onto one import namespace, ``gpu_offload``.

``magics/`` becomes ``gpu_offload.magics`` and so on, so a user's own ``flows/`` or ``magics/`` folder can
never shadow ours. Sub-packages are discovered, so adding one needs no edit here.
"""

from setuptools import find_namespace_packages, setup

ROOTS = {
    "gpu_offload": "src/gpu_offload",
    "gpu_offload.magics": "magics",
    "gpu_offload.liqo_peering": "liqo_peering",
    "gpu_offload.flows": "flows",
    "gpu_offload.hub_extension": "hub_extension",
    "gpu_offload.sandbox": "sandbox",
}

packages = []
for name, path in ROOTS.items():
    packages.append(name)
    packages += [
        f"{name}.{sub}"
        for sub in find_namespace_packages(path, exclude=["*__pycache__*", "*.egg-info*"])
    ]

setup(
    package_dir=ROOTS,
    packages=packages,
    package_data={"": ["*.json", "*.yaml", "*.ipynb", "*.html", "*.js", "*.css", "py.typed"]},
)
