// What the demo's shared object exports: its library is linked into it, not
// into the program.
#ifndef PACKAGE_DEMO_H_
#define PACKAGE_DEMO_H_

// Transposes through the server at `target` (HOST:PORT); prints "ok" and
// returns 0 when every result is right, or says what failed and returns 1.
int RunPackageDemo(const char* target);

#endif  // PACKAGE_DEMO_H_
