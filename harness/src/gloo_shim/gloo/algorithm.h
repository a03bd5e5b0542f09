#pragma once
// Declaration-only stand-in (see ../README.md).
#include "gloo/context.h"
