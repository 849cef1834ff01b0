"""Maps the one import package `tickwire` onto the repository's top-level folders.

`tickwire`            <- tickwire/   (command line and version)
`tickwire.protocol`   <- protocol/   (sans-I/O wire code)
`tickwire.server`     <- server/     (update graph, publishing, gRPC services)
`tickwire.clients`    <- clients/    (the Python Barrage client)
"""
from setuptools import find_packages, setup

SUBPACKAGES = {"protocol": "protocol", "server": "server", "clients": "clients"}

packages = ["tickwire"]
package_dir = {"tickwire": "tickwire"}
for name, folder in SUBPACKAGES.items():
    packages.append(f"tickwire.{name}")
    package_dir[f"tickwire.{name}"] = folder
    for sub in find_packages(folder):
        packages.append(f"tickwire.{name}.{sub}")
        package_dir[f"tickwire.{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir,
      package_data={"": ["*.fbs", "*.proto", "*.java", "*.properties"], "tickwire": ["py.typed"]})
