/* libsinkd public API: being written */
#ifndef SINKD_CLIENT_H
#define SINKD_CLIENT_H
#include "sinkd/protocol.h"
#endif
