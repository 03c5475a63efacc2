"""Print the requirements of gpupipe (and the given extras) from pyproject.toml, one a line.

hack/lock-images.sh (make lock) resolves these at constraints.txt's versions into
images/requirements.lock, the hashed lock the images install first, so that a change to the
package's code rebuilds only the last layer. Self-references (``gpupipe[...]``) are left out.
Usage: python requirements.py pyproject.toml [extra ...]
"""

import sys
import tomllib


def main(argv: list[str]) -> int:
    with open(argv[1], "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = list(project["dependencies"])
    for extra in argv[2:]:
        wanted += project["optional-dependencies"][extra]
    for req in wanted:
        if not req.replace(" ", "").startswith(project["name"] + "["):
            print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
