"""What the scripts/check-*.py share: their command line and the self-test's files.

    check-NAME.py [--root DIR]   # exit 1 and a line per problem
    check-NAME.py --self-test    # proves the check catches what it is for
"""
import argparse
import os


def write(root, rel, text):
    """Writes text to root/rel, making its folders (a self-test's tree)."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def main(doc, check, self_test, failed, passed):
    """Runs self_test() with --self-test, else check(root): prints each problem then
    failed(count) and returns 1, or prints passed(root) and returns 0."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(failed(len(problems)))
        return 1
    print(passed(root))
    return 0
