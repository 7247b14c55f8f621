/* Prints what tutti_get_unique_id made (its text: "tutti-uid1 tcp://addr:port ..."), or
 * the thread's error and exits 1: tests/test_ifname.sh reads the address it chose. */
#include <stdio.h>

#include <tutti/tutti.h>

int main(void)
{
    tutti_unique_id_t id;
    if (tutti_get_unique_id(&id) != 0) {
        fprintf(stderr, "uid_print: %s\n", tutti_comm_last_error(NULL));
        return 1;
    }
    printf("%s\n", id.internal);
    return tutti_unique_id_release(&id) == 0 ? 0 : 1;
}
