"""Maps the top-level folders verifiers/, sandboxes/, datasets/ to reasonrl.verifiers, reasonrl.sandboxes and
reasonrl.datasets, so nothing generic is installed into site-packages (docs/architecture.md, Layout)."""
from setuptools import find_packages, setup

MAPPED = {"reasonrl": "reasonrl", "reasonrl.verifiers": "verifiers", "reasonrl.sandboxes": "sandboxes",
          "reasonrl.datasets": "datasets"}
packages = []
for name, folder in MAPPED.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder) if f"{name}.{sub}" not in MAPPED]

setup(packages=packages, package_dir=MAPPED, include_package_data=True,
      package_data={"reasonrl.sandboxes": ["images/*", "images/**/*"]})
