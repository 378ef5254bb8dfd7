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
    # Metaflow finds extensions only under this top-level namespace package (no __init__.py by Metaflow's
    # rule); its modules are thin shims over gpu_offload.flows.
    "metaflow_extensions": "flows/metaflow_extensions",
}
# Folders that get their own ROOTS entry and must not be discovered again under another name.
NESTED_ROOTS = {"gpu_offload.flows": ["metaflow_extensions", "metaflow_extensions.*"]}

packages = []
for name, path in ROOTS.items():
    packages.append(name)
    packages += [
        f"{name}.{sub}"
        for sub in find_namespace_packages(
            path, exclude=["*__pycache__*", "*.egg-info*", *NESTED_ROOTS.get(name, [])]
        )
    ]

setup(
    package_dir=ROOTS,
    packages=packages,
    package_data={"": ["*.json", "*.yaml", "*.ipynb", "*.html", "*.js", "*.css", "py.typed"]},
    # Enables the runs REST API (the panel's view of runs across kernels) in every Jupyter server of the
    # environment, as jupyter-server extensions conventionally do.
    data_files=[
        (
            "etc/jupyter/jupyter_server_config.d",
            ["jupyter-config/jupyter_server_config.d/gpu_offload.json"],
        )
    ],
)
