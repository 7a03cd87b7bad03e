// package_demo HOST:PORT: the shared object's demo, from a program.
#include <cstdio>

#include "package_demo.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: package_demo HOST:PORT\n");
    return 2;
  }
  return RunPackageDemo(argv[1]);
}
